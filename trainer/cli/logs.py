"""Terminal output: distloop's progress at INFO, libraries' INFO chatter hidden.

Libraries' INFO lines (trainer/loop/library_logs.py, as for the Python API) and
TensorFlow's C++ log (harmless internal messages even at ERROR level) show only with
--verbosity=1 or more.
A TF_CPP_MIN_LOG_LEVEL set by the user is respected.

A checkpoint write that fails for lack of space or permission is reported by
the trainer as one line (trainer/store/storage.py); orbax's own error records about
it (tracebacks from its background threads) and tensorstore's late asyncio
callbacks ("Event loop is closed") are hidden unless --verbosity=1.
"""
import sys
import threading
import warnings

from absl import logging

from input_pipelines import native_output
from input_pipelines.native_output import native_startup_silenced  # noqa: F401
from trainer.loop import library_logs


class _WithoutClosedLoopTracebacks:
  """sys.stderr minus the traceback tensorstore prints (from C, piece by piece) for
  each callback that completes after orbax closed its asyncio loop, as after a failed
  write: noise, the failure itself is reported. Other text passes through at once; a
  traceback is held only until its exception line shows which one it is."""

  _HEADER = "Traceback (most recent call last):"
  _NOISE = "RuntimeError: Event loop is closed"

  def __init__(self, stream):
    self._stream = stream
    self._held = ""
    self._lock = threading.RLock()  # a held traceback may be followed by another

  def write(self, text: str) -> int:
    with self._lock:
      if not self._held and not text.startswith(self._HEADER):
        return self._stream.write(text)
      self._held += text
      lines = self._held.split("\n")
      for i, line in enumerate(lines[1:-1], start=1):  # complete lines after the header
        if line.startswith(" "):
          continue  # a frame
        block, rest = "\n".join(lines[:i + 1]) + "\n", "\n".join(lines[i + 1:])
        self._held = ""
        if line != self._NOISE:
          self._stream.write(block)
        if rest:
          self.write(rest) if rest.startswith(self._HEADER) else self._stream.write(rest)
        break
      return len(text)

  def __getattr__(self, name):  # flush, fileno, isatty, encoding, ...
    return getattr(self._stream, name)


def quiet_libraries() -> None:
  """Call once, after flags are parsed (so --verbosity is known) and before
  TensorFlow is imported (its C++ log level is read at import)."""
  verbose = native_output.quiet_tensorflow()
  if not verbose:
    library_logs.hide_library_info(logging.get_absl_handler())
    sys.stderr = _WithoutClosedLoopTracebacks(sys.stderr)
    # tf.data says this whenever a strategy distributes a dataset that has options.
    warnings.filterwarnings("ignore", message="To make it possible to preserve tf.data options")


