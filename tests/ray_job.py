"""examples/ray_train.py on a local Ray cluster bound to 127.0.0.1: `python -m tests.ray_job
[the example's flags]`. Run it in the private network namespace (tests/processes.py):
Ray's and TensorFlow's servers listen on every address, and only loopback exists there."""
import os
import runpy
import sys

import trainer  # noqa: F401  first, as the example does: the CPU kernels, before TensorFlow
import ray

from tests.cli import REPO

if __name__ == "__main__":
  ray.init(_node_ip_address="127.0.0.1", include_dashboard=False,
           num_cpus=max(2, os.cpu_count() or 1), object_store_memory=100 * 1024 * 1024)
  example = os.path.join(REPO, "examples", "ray_train.py")
  sys.argv = [example, *sys.argv[1:]]
  runpy.run_path(example, run_name="__main__")
