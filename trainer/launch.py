"""`python -m trainer.launch --num_workers=N [--num_ps=M] [--max_restarts=K] -- <trainer flags>`

Runs a multi-process job on this machine, one `python -m trainer` per task. The
launcher itself lives with the rest of the cluster in trainer/cluster/launch.py;
this module keeps the documented command.
"""
if __name__ == "__main__":
  from absl import flags
  from trainer.cluster import launch
  __doc__ = launch.__doc__  # --help: the command's own description and flags
  flags.adopt_module_key_flags(launch)
  launch.run()
