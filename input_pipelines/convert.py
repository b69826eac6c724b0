"""`python -m input_pipelines.convert --from=FORMAT --input=PATH --output=DIR [...]`

Converts a dataset into the records format (`data.name='records'`). The converter
lives with the format in input_pipelines/records/convert.py; this module keeps the
documented command.
"""
if __name__ == "__main__":
  from absl import flags
  from input_pipelines.records import convert
  __doc__ = convert.__doc__  # --help: the command's own description and flags
  flags.adopt_module_key_flags(convert)
  convert.run()
