"""The per-loop progress line: redrawn in place on a terminal, one log line otherwise.

On a terminal (stderr is a TTY), `step 150/300 [#####.....] 50% | loss ... | ETA`
is rewritten in place at each loop boundary (carriage return, erase to the end of
the line) and stays below everything else: any other write to stderr (absl's log
lines, the CLI's error line) first erases it, then draws it again after its
newline. `finish()` leaves the last state on its own line. Anywhere else (a pipe,
CI, a Slurm log, the launcher's prefixed output) each update is the usual INFO
line, one per loop, as before. `Throughput` measures the examples/s that the
line and summary.json report.

Why not tqdm or rich: updates come only at loop boundaries, with our own measured
examples/s and ETA (tqdm's rate smoothing assumes frequent ticks), and the line
must share stderr with absl's handler and our error line; this is a few lines and
no new dependency.
"""
import atexit
import dataclasses
import os
import sys

from absl import logging

_ERASE = "\r\x1b[K"
_BAR_WIDTH = 20


class _Terminal:
  """Stands in for sys.stderr: other output erases the live line first, redraws it after."""

  def __init__(self, stream):
    self._stream = stream
    self._line = ""
    self._drawn = False

  def show(self, line: str) -> None:
    try:
      width = os.get_terminal_size(self._stream.fileno()).columns
    except (OSError, ValueError):
      width = 0
    self._line = line[:width - 1] if width > 1 else line  # a wrapped line cannot be redrawn
    self._stream.write(_ERASE + self._line)
    self._stream.flush()
    self._drawn = True

  def finish(self) -> None:
    if self._drawn:
      self._stream.write("\n")
      self._stream.flush()
    self._line, self._drawn = "", False

  def write(self, text: str) -> int:
    if self._drawn and text:
      self._stream.write(_ERASE)
      self._drawn = False
    written = self._stream.write(text)
    if self._line and text.endswith("\n"):
      self._stream.write(self._line)
      self._drawn = True
    return written

  def __getattr__(self, name):  # flush, fileno, isatty, encoding, ...
    return getattr(self._stream, name)


_terminal: _Terminal | None = None
_checked = False


def _live() -> _Terminal | None:
  """The terminal wrapper, installed on first use if stderr is a TTY."""
  global _terminal, _checked
  if not _checked:
    _checked = True
    if sys.stderr.isatty():
      _terminal = _Terminal(sys.stderr)
      handler = logging.get_absl_handler().python_handler
      if handler.stream in (sys.stderr, sys.__stderr__):  # absl's log lines go through it too
        handler.stream = _terminal
      sys.stderr = _terminal
      atexit.register(finish)
  return _terminal


def show(step: int, total: int, details: str) -> None:
  """`step N/TOTAL | details`: redrawn in place on a TTY, else one INFO line."""
  terminal = _live()
  if terminal is None:
    logging.info("step %d/%d | %s", step, total, details)
    return
  done = int(_BAR_WIDTH * step / total) if total else _BAR_WIDTH
  terminal.show(f"step {step}/{total} [{'#' * done}{'.' * (_BAR_WIDTH - done)}] "
                f"{100 * step // max(total, 1)}% | {details}")


def finish() -> None:
  """Ends the live line (the loop is over): later output goes below it."""
  if _terminal is not None:
    _terminal.finish()


@dataclasses.dataclass
class Throughput:
  """Steady-state examples/s: the first loop of a process (it traces) is kept apart."""
  first_examples: int = 0
  first_seconds: float = 0.0
  steady_examples: int = 0
  steady_seconds: float = 0.0

  def add(self, examples: int, seconds: float) -> None:
    if self.first_seconds == 0.0:
      self.first_examples, self.first_seconds = examples, seconds
    else:
      self.steady_examples += examples
      self.steady_seconds += seconds

  def per_second(self) -> float:
    """Steady throughput; the first loop's only when it was the only one."""
    if self.steady_seconds > 0:
      return self.steady_examples / self.steady_seconds
    return self.first_examples / self.first_seconds if self.first_seconds > 0 else 0.0

  @property
  def seconds(self) -> float:
    return self.first_seconds + self.steady_seconds
