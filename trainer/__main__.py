"""`python -m trainer --config=NAME --model_dir=DIR [--mode=MODE] [--config.FIELD=VALUE ...]`

The command line: flags, modes and exit codes live in trainer/cli/main.py. The
signal handlers come first, before the heavier imports (a signal at any moment is
a request to stop, never a bare death: trainer/cluster/preemption.py).
"""
if __name__ == "__main__":
  import sys
  from trainer import errors
  from trainer.cluster import preemption
  preemption.install(start_up=True)
  try:  # a signal during the imports below exits with --preempted_exit_code too
    errors.set_preempted_exit_code(errors.preempted_exit_code_in(sys.argv[1:]) or errors.EXIT_PREEMPTED)
  except errors.UserError:
    pass  # main.run() refuses it in one line
  from trainer.setup import module_names
  shadowed = module_names.shadowing()  # before distloop's own packages are imported
  if shadowed:
    print(f"distloop: error: {shadowed}", file=sys.stderr)
    sys.exit(errors.EXIT_BAD_INPUT)

  from absl import flags
  from trainer.cli import main
  __doc__ = main.__doc__  # --help: the command's own description and flags
  flags.adopt_module_key_flags(main)
  main.run()
