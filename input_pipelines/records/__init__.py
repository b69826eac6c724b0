"""The records format and its converter: converted data on disk, read by row.

The format: shards (array_record files), manifest (manifest.json, their index and
checks), features (the feature spec: how each feature is stored and decoded).
Reading it: records (`data.name='records'`, the RecordSource). Writing it: convert
(`python -m input_pipelines.convert`, the command kept at input_pipelines/convert.py),
convert_inputs (each input format it reads, reusing input_pipelines/datasets/'s
readers), progress (progress.json and the progress bar: a conversion resumes by shard).
"""
