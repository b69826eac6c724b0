"""A trainer process to watch and signal: wait for a log line, then act.

Verify (and the guarantee harness, tests/guarantees, through tests/support/processes.py)
reacts to what the trainer says ("step 35/") instead of sleeping, so a stop lands on
the step it means to on any machine.
"""
import os
import queue
import re
import signal
import subprocess
import sys
import threading

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class Failed(AssertionError):
  """A process that did not do what was waited for: its log's tail is in the message."""


def user_environment() -> dict:
  """os.environ as a user's shell has it: importing TensorFlow in this process set
  TF_CPP_MIN_LOG_LEVEL=1, which a child would inherit instead of the trainer's default."""
  return {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}


class TrainerProcess:
  """`python -m trainer --model_dir=DIR FLAGS...` (or another `module`), its output read
  line by line in a thread."""

  def __init__(self, model_dir, *flags: str, module: str = "trainer", env: dict | None = None,
               prefix: list[str] | None = None, cwd: str | None = None):
    self.lines: list[str] = []
    self._queue: "queue.Queue[str | None]" = queue.Queue()
    model_dir_flags = [f"--model_dir={model_dir}"] if module == "trainer" else []
    command = [*(prefix or []), sys.executable, "-m", module, *model_dir_flags, *flags]
    self.process = subprocess.Popen(command, cwd=cwd or REPO, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True,
                                    env={**user_environment(), **(env or {})})
    threading.Thread(target=self._read, daemon=True).start()

  def _read(self):
    for line in self.process.stdout:
      self._queue.put(line)
    self._queue.put(None)

  def wait_for(self, pattern: str, timeout: float = 300) -> re.Match:
    """Blocks until a line matches `pattern`; Failed if the process ends first."""
    regex = re.compile(pattern)
    while True:
      try:
        line = self._queue.get(timeout=timeout)
      except queue.Empty:
        raise Failed(f"no line matching {pattern!r} in {timeout}s:\n" +
                     "".join(self.lines[-30:])) from None
      if line is None:
        raise Failed(f"process ended before {pattern!r}:\n" + "".join(self.lines[-30:]))
      self.lines.append(line)
      match = regex.search(line)
      if match:
        return match

  def send(self, signum: int = signal.SIGTERM) -> None:
    self.process.send_signal(signum)

  def finish(self, timeout: float = 300) -> int:
    """The exit code; a process still running after `timeout` is killed: Failed, with its
    log (a hang: every wait has a limit)."""
    try:
      return self.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
      raise Failed(f"still running after {timeout} s (a hang?):\n{self.output[-4000:]}") from None
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


def read_checkpoint(model_dir, step: int, items=("model", "optimizer")) -> dict:
  """{'model/...': array, 'optimizer/...': array} of checkpoints/<step>, by plain orbax in
  this process (the keys the digests use)."""
  os.environ.setdefault("JAX_PLATFORMS", "cpu")  # orbax imports JAX
  import numpy as np  # pylint: disable=import-outside-toplevel
  import orbax.checkpoint as ocp  # pylint: disable=import-outside-toplevel
  from trainer.state import checkpoints  # pylint: disable=import-outside-toplevel
  flat = {}
  for item in items:
    item_dir = os.path.join(str(model_dir), "checkpoints", str(step), item)
    if os.path.isdir(item_dir):
      tree = ocp.PyTreeCheckpointer().restore(item_dir)
      flat.update({key: np.asarray(value)
                   for key, value in checkpoints.flatten(tree, item).items()})
  return flat
