"""A trainer process a test can watch and signal: wait for a log line, then act.

Tests react to what the trainer says (e.g. "step 35/") instead of sleeping.
"""
import functools
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading

import numpy as np
import pytest

from tests.support.cli import REPO, user_environment


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


class TrainerProcess:

  def __init__(self, model_dir, *flags: str, module: str = "trainer", env: dict | None = None,
               prefix: list[str] | None = None):
    self.lines: list[str] = []
    self._queue: "queue.Queue[str | None]" = queue.Queue()
    model_dir_flags = [f"--model_dir={model_dir}"] if module == "trainer" else []
    command = [*(prefix or []), sys.executable, "-m", module, *model_dir_flags, *flags]
    self.process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True,
                                    env={**user_environment(), **(env or {})})
    threading.Thread(target=self._read, daemon=True).start()

  def _read(self):
    for line in self.process.stdout:
      self._queue.put(line)
    self._queue.put(None)

  def wait_for(self, pattern: str, timeout: float = 300) -> re.Match:
    """Blocks until a line matches `pattern`; fails if the process ends first."""
    regex = re.compile(pattern)
    while True:
      try:
        line = self._queue.get(timeout=timeout)
      except queue.Empty:
        raise AssertionError(f"no line matching {pattern!r} in {timeout}s:\n" +
                             "".join(self.lines[-30:])) from None
      if line is None:
        raise AssertionError(f"process ended before {pattern!r}:\n" + "".join(self.lines[-30:]))
      self.lines.append(line)
      match = regex.search(line)
      if match:
        return match

  def send(self, signum: int = signal.SIGTERM) -> None:
    self.process.send_signal(signum)

  def finish(self, timeout: float = 300) -> int:
    """The exit code; a process still running after `timeout` is killed and the test
    fails with its log (a hang: every multi-process wait has a limit)."""
    try:
      return self.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
      pytest.fail(f"still running after {timeout} s (a hang?):\n{self.output[-4000:]}")
    finally:
      self.kill()

  def stop_at(self, pattern: str, timeout: float = 300) -> int:
    """Waits for a line matching `pattern`, sends SIGTERM and returns the exit code (42:
    preempted, the step saved); the process is killed if anything here fails."""
    try:
      self.wait_for(pattern, timeout=timeout)
      self.send(signal.SIGTERM)
    except BaseException:
      self.kill()
      raise
    return self.finish(timeout)

  def wait(self, timeout: float = 300) -> int:
    returncode = self.process.wait(timeout=timeout)
    while True:  # drain what is left, so `output` is complete
      try:
        line = self._queue.get(timeout=10)
      except queue.Empty:
        break
      if line is None:
        break
      self.lines.append(line)
    return returncode

  @property
  def output(self) -> str:
    return "".join(self.lines)

  def kill(self) -> None:
    if self.process.poll() is None:
      self.process.kill()
      self.process.wait()


def checkpoint_arrays(model_dir, step: int) -> dict:
  """{'model/mnist_cnn/conv/kernel': array, 'optimizer/...': ...} of checkpoints/<step>,
  read with plain orbax (in this process: a child per read cost ~2 s of CI each)."""
  arrays = read_checkpoint(model_dir, step)
  assert any(key.startswith("model/") for key in arrays), f"{model_dir}: no step {step}"
  return arrays


def read_checkpoint(model_dir, step: int, items=("model", "optimizer")) -> dict:
  """{'model/...': array, 'optimizer/...': array} of checkpoints/<step>, by plain orbax in
  this process."""
  import orbax.checkpoint as ocp  # pylint: disable=import-outside-toplevel
  flat = {}

  def walk(node, path):
    for key, value in node.items():
      if isinstance(value, dict):
        walk(value, f"{path}/{key}")
      else:
        flat[f"{path}/{key}"] = np.asarray(value)

  for item in items:
    item_dir = os.path.join(str(model_dir), "checkpoints", str(step), item)
    if os.path.isdir(item_dir):
      walk(ocp.PyTreeCheckpointer().restore(item_dir), item)
  return flat


def assert_same_state(actual: dict, expected: dict, atol: float) -> None:
  assert actual.keys() == expected.keys()
  for key in expected:
    np.testing.assert_allclose(actual[key], expected[key], atol=atol, rtol=0, err_msg=key)
