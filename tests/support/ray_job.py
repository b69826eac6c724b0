"""examples/ray_train.py on a local Ray cluster bound to 127.0.0.1: `python -m tests.support.ray_job
[the example's flags]`. Run it in the private network namespace (tests/support/processes.py):
Ray's and TensorFlow's servers listen on every address, and only loopback exists there.

With RAY_JOB_RESULT=PATH it writes what a Ray user reads from the example's `result` to
PATH (JSON): `metrics`, `checkpoint_dir` (ray_train.checkpoint_dir(result.checkpoint);
None without a checkpoint) and the `step` column of `metrics_dataframe`."""
import json
import os
import runpy
import sys

import trainer  # noqa: F401  first, as the example does: the CPU kernels, before TensorFlow
import ray

from tests.support.cli import REPO

def run_example(name: str, value: str):
  """examples/`name` as `python examples/NAME ARGS` runs it, on a local Ray cluster bound to
  127.0.0.1 (ARGS: this process's); the example's global `value` (what its user reads)."""
  ray.init(_node_ip_address="127.0.0.1", include_dashboard=False,
           num_cpus=max(2, os.cpu_count() or 1), object_store_memory=100 * 1024 * 1024)
  example = os.path.join(REPO, "examples", name)
  sys.argv = [example, *sys.argv[1:]]
  return runpy.run_path(example, run_name="__main__")[value]


if __name__ == "__main__":
  result = run_example("ray_train.py", "result")
  if os.environ.get("RAY_JOB_RESULT"):
    from trainer import ray_train
    frame = result.metrics_dataframe
    read = {"metrics": result.metrics,
            "checkpoint_dir": result.checkpoint and ray_train.checkpoint_dir(result.checkpoint),
            "dataframe_steps": None if frame is None else [int(s) for s in frame["step"]]}
    with open(os.environ["RAY_JOB_RESULT"], "w", encoding="utf-8") as f:
      json.dump(read, f)
