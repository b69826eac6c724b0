"""Without a private network namespace (no root, unshare or ip) the multi-process
tests are skipped with the reason, and pytest's summary says so, instead of running
TensorFlow's gRPC servers on 0.0.0.0."""
import os
import subprocess
import sys

from tests.support.cli import REPO


def test_multi_process_tests_skip_with_a_reason_when_unshare_and_ip_are_missing():
  no_tools = {**os.environ, "PATH": os.path.dirname(sys.executable)}  # python, no unshare/ip
  completed = subprocess.run(
      [sys.executable, "-m", "pytest", "tests/cluster/test_multi_worker.py", "-p", "no:cacheprovider",
       "-n", "0",  # in this process: no pytest-xdist workers to start (each imports TensorFlow)
       "-m", "slow or not slow",  # the file is marked slow: select it whatever the default
       "-k", "two_workers_reach or slurm_environment"],
      cwd=REPO, env=no_tools, capture_output=True, text=True, timeout=300)
  out = completed.stdout
  assert completed.returncode == 0, out[-3000:]
  assert "2 skipped" in out and "passed" not in out, out[-3000:]
  reason = ("multi-process TensorFlow tests skipped: unshare and ip not found; TensorFlow's "
            "gRPC servers listen on 0.0.0.0")
  assert out.count("SKIPPED [1] tests/cluster/test_multi_worker.py") == 2, out  # -ra, from setup.cfg
  assert reason in out
  summary = [line for line in out.splitlines() if line.startswith("=") and reason in line]
  assert summary and summary[0].lstrip("= ").startswith("2 "), out
