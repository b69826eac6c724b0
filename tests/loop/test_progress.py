"""The progress line: redrawn in place when stderr is a terminal (run under a pty),
one INFO line per loop when it is not (a pipe: CI, Slurm logs, the launcher)."""
import io
import os
import pty
import re
import subprocess
import sys
import threading

from tests.support.cli import REPO, run_trainer
from trainer.loop import progress

_FLAGS = ["--config=synthetic", "--config.train.steps=40", "--config.train.steps_per_loop=10",
          "--config.checkpoint.interval=20", "--config.data.num_train_examples=1000",
          "--config.data.num_eval_examples=500"]
_ERASE = "\r\x1b[K"


def _run_on_a_terminal(model_dir) -> tuple[int, str]:
  """The trainer with stdout and stderr on a pseudo-terminal; returns (exit code, bytes seen)."""
  controller, terminal = pty.openpty()
  process = subprocess.Popen([sys.executable, "-m", "trainer", f"--model_dir={model_dir}",
                              *_FLAGS], cwd=REPO, stdin=subprocess.DEVNULL, stdout=terminal,
                             stderr=terminal, env={**os.environ, "COLUMNS": "200"})
  os.close(terminal)
  chunks = []

  def read():  # keep draining, or the child blocks on a full terminal buffer
    while True:
      try:
        chunk = os.read(controller, 65536)
      except OSError:  # EIO: the child closed its side
        return
      if not chunk:
        return
      chunks.append(chunk)
  reader = threading.Thread(target=read, daemon=True)
  reader.start()
  code = process.wait(timeout=300)
  reader.join(timeout=10)
  os.close(controller)
  return code, b"".join(chunks).decode(errors="replace").replace("\r\n", "\n")


def test_on_a_terminal_the_line_is_redrawn_in_place(tmp_path):
  code, seen = _run_on_a_terminal(tmp_path)
  assert code == 0, seen[-3000:]
  draws = re.findall(r"\r\x1b\[K(step (\d+)/40 \[[#.]{20}\] \d+% \| epoch [\d.]+ \| loss [\d.]+ "
                     r".*? examples/s \| ETA \d+:\d\d:\d\d)", seen)
  assert [int(step) for _, step in draws][:4] == [10, 20, 30, 40], seen[-3000:]
  assert "step 40/40 [####################] 100% |" in seen
  # No scrolled progress log lines; other log lines erase the live one and start a line.
  assert not re.search(r"\] step \d+/40 \|", seen)
  assert re.search(r"\r\x1b\[KI\d{4} [^\n]*checkpoint at step 20 started", seen), seen[-3000:]
  assert re.search(r"\r\x1b\[KI\d{4} [^\n]*eval at step 40", seen)
  assert seen.endswith("\n")


def test_without_a_terminal_one_line_per_loop(tmp_path):
  result = run_trainer(tmp_path, *_FLAGS)
  assert result.returncode == 0, result.stderr[-3000:]
  lines = [line for line in result.stderr.splitlines() if re.search(r"\] step \d+/40 \| ", line)]
  assert [re.search(r"step (\d+)/", line).group(1) for line in lines] == ["10", "20", "30", "40"]
  assert "\r" not in result.stderr and "\x1b[" not in result.stderr


class _FakeTerminal(io.StringIO):

  def isatty(self) -> bool:
    return True


def test_other_output_erases_the_line_and_redraws_it_below():
  screen = _FakeTerminal()
  terminal = progress._Terminal(screen)  # pylint: disable=protected-access
  terminal.show("step 10/40 a")
  terminal.write("a log line\n")
  terminal.show("step 20/40 b")
  terminal.write("distloop: error: ")  # print() writes the text, then the newline
  terminal.write("boom")
  terminal.write("\n")
  terminal.finish()
  terminal.write("after\n")
  assert screen.getvalue() == (
      f"{_ERASE}step 10/40 a{_ERASE}a log line\nstep 10/40 a{_ERASE}step 20/40 b"
      f"{_ERASE}distloop: error: boom\nstep 20/40 b\nafter\n")
