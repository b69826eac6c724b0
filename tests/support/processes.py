"""A trainer process a test can watch and signal: wait for a log line, then act.

Tests react to what the trainer says (e.g. "step 35/") instead of sleeping.
"""
import functools
import os
import shutil
import subprocess

import numpy as np
import pytest

from trainer.verify import processes
from trainer.verify.processes import read_checkpoint  # noqa: F401  (tests read it here)


LOOPBACK_SKIP = "multi-process TensorFlow tests skipped"


@functools.cache
def loopback_unavailable() -> str | None:
  """Why the multi-process tests cannot keep TensorFlow's gRPC servers on loopback
  (a private network namespace), or None if they can."""
  missing = [tool for tool in ("unshare", "ip") if not shutil.which(tool)]
  if os.geteuid() != 0 or missing:
    why = "not root" if os.geteuid() != 0 else f"{' and '.join(missing)} not found"
  else:
    probe = subprocess.run(["unshare", "--net", "ip", "link", "set", "lo", "up"],
                           capture_output=True, text=True)
    if probe.returncode == 0:
      return None
    why = f"unshare --net failed ({probe.stderr.strip()[:200]})"
  return (f"{LOOPBACK_SKIP}: {why}; TensorFlow's gRPC servers listen on 0.0.0.0 whatever "
          f"TF_CONFIG says, so these tests run only in a private network namespace "
          f"(root, unshare and ip from iproute2, as in CI)")


needs_loopback = pytest.mark.skipif(loopback_unavailable() is not None,
                                    reason=str(loopback_unavailable()))


def loopback_only() -> list[str]:
  """A command prefix that runs a process tree in a private network namespace with
  only 127.0.0.1 up; skips the calling test when that is impossible.

  TensorFlow's gRPC server listens on 0.0.0.0 whatever address TF_CONFIG gives
  (grpc_server_lib.cc); inside the namespace nothing but loopback exists.
  Mark a test `@needs_loopback` too, so it skips before its fixtures run.
  """
  reason = loopback_unavailable()
  if reason is not None:
    pytest.skip(reason)
  return ["unshare", "--net", "sh", "-c", 'ip link set lo up && exec "$0" "$@"']


def dies_with_its_test() -> list[str]:
  """A command prefix: the kernel SIGKILLs the process when the test process that started
  it dies, by whatever signal (PR_SET_PDEATHSIG, kept across exec, set by util-linux's
  setpriv), so a trainer never outlives its test as an orphan (ppid 1) holding a core and
  a model_dir's lock. A pytest stopped by SIGTERM first ends as on Ctrl-C
  (tests/conftest.py), the tests' `finally` blocks and fixtures killing their processes;
  this covers the rest (SIGKILL, an xdist worker killed). The kernel watches the thread
  that started the process, not the test process as a whole: start it from a thread that
  outlives it (subprocess.run in a pool's thread does). Empty where setpriv is missing."""
  return ["setpriv", "--pdeathsig", "KILL"] if shutil.which("setpriv") else []


class TrainerProcess(processes.TrainerProcess):
  """trainer/verify/processes.py's (the product's: verify and the harness watch a trainer
  the same way), failing the test where it raises Failed, and dying with its test
  (`dies_with_its_test`)."""

  def __init__(self, model_dir, *flags: str, prefix: list[str] | None = None, **kwargs):
    super().__init__(model_dir, *flags, prefix=[*dies_with_its_test(), *(prefix or [])],
                     **kwargs)

  def finish(self, timeout: float = 300) -> int:
    try:
      return super().finish(timeout)
    except processes.Failed as e:
      pytest.fail(str(e))


def checkpoint_arrays(model_dir, step: int) -> dict:
  """{'model/mnist_cnn/conv/kernel': array, 'optimizer/...': ...} of checkpoints/<step>,
  read with plain orbax (in this process: a child per read cost ~2 s of CI each)."""
  arrays = read_checkpoint(model_dir, step)
  assert any(key.startswith("model/") for key in arrays), f"{model_dir}: no step {step}"
  return arrays


def assert_same_state(actual: dict, expected: dict, atol: float) -> None:
  assert actual.keys() == expected.keys()
  for key in expected:
    np.testing.assert_allclose(actual[key], expected[key], atol=atol, rtol=0, err_msg=key)
