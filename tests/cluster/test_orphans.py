"""A test's processes die with it: pytest stopped by SIGTERM (a CI job cancelled, a
timeout's kill) leaves no trainer running as an orphan (ppid 1), holding a core and its
model_dir's lock (tests/conftest.py's SIGTERM as Ctrl-C; tests/support/processes.py's
dies_with_its_test)."""
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.support.cli import REPO

pytestmark = pytest.mark.slow  # a pytest of its own (xdist: a controller and a worker)

_INNER_TEST = '''
from tests.support.cli import run_trainer
from tests.support.processes import TrainerProcess

_HUNG = "--config=tests/plugins/hung_plugins.py"  # its get_config sleeps until the end


def test_hangs(tmp_path):
    TrainerProcess(tmp_path / "watched", _HUNG)  # left running: no `finally` kills it
    run_trainer(tmp_path / "waited_for", _HUNG)  # subprocess.run, waited for
'''


def _trainers_under(path: str) -> set[int]:
  """The pids of the `python -m trainer` processes whose model_dir is under `path`."""
  found = set()
  for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
      with open(f"/proc/{pid}/cmdline", "rb") as f:
        args = f.read().split(b"\0")
      with open(f"/proc/{pid}/stat") as f:
        state = f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
      continue
    if state != "Z" and b"trainer" in args and any(path.encode() in arg for arg in args):
      found.add(int(pid))
  return found


def test_sigterm_to_pytest_ends_the_trainers_of_its_tests(tmp_path):
  """Catches a trainer left orphaned (SIGTERM's default ended pytest at once, and nothing
  tied a trainer's life to its test's)."""
  (tmp_path / "pytest.ini").write_text("[pytest]\n")
  (tmp_path / "test_inner.py").write_text(_INNER_TEST)
  base = tmp_path / "base"
  inner = subprocess.Popen(  # pylint: disable=consider-using-with
      [sys.executable, "-m", "pytest", "-c", str(tmp_path / "pytest.ini"),
       str(tmp_path / "test_inner.py"), "-p", "tests.conftest", "-p", "no:cacheprovider",
       "-n", "1", f"--basetemp={base}"], cwd=REPO, stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT, text=True)
  try:
    deadline = time.monotonic() + 240
    while len(_trainers_under(str(base))) < 2:
      assert inner.poll() is None and time.monotonic() < deadline, inner.communicate()[0]
      time.sleep(0.2)
    trainers = _trainers_under(str(base))
    inner.send_signal(signal.SIGTERM)
    output = inner.communicate(timeout=120)[0]
    deadline = time.monotonic() + 30  # a SIGKILL is delivered at once; a zombie is gone
    while _trainers_under(str(base)) and time.monotonic() < deadline:
      time.sleep(0.2)
    assert not _trainers_under(str(base)), (trainers, output[-2000:])
  finally:
    for pid in _trainers_under(str(base)):  # a failing run: none is left behind either
      os.kill(pid, signal.SIGKILL)
    if inner.poll() is None:
      inner.kill()
      inner.wait()
