"""Terminal output: distloop's progress at INFO, libraries' INFO chatter hidden.

orbax logs a dozen INFO lines per checkpoint and TensorFlow a few per export,
through the same absl handler as our progress lines. Their Python warnings and
errors always show; their INFO lines, and TensorFlow's C++ log (harmless
internal messages even at ERROR level), only with --verbosity=1 or more.
A TF_CPP_MIN_LOG_LEVEL set by the user is respected.

A checkpoint write that fails for lack of space or permission is reported by
the trainer as one line (trainer/state/storage.py); orbax's own error records about
it (tracebacks from its background threads) and tensorstore's late asyncio
callbacks ("Event loop is closed") are hidden unless --verbosity=1.
"""
import logging as std_logging
import os
import sys
import threading
import warnings

from absl import logging

from input_pipelines import native_output
from input_pipelines.native_output import native_startup_silenced  # noqa: F401
from trainer.state import storage

_LIBRARY_PATHS = ("/orbax/", "/tensorflow/", "/keras/", "/jax/", "/etils/")
# distloop's own files are never a library's, wherever the checkout lives (~/keras/distloop).
_OWN_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + os.sep


class _HideLibraryInfo(std_logging.Filter):

  def filter(self, record: std_logging.LogRecord) -> bool:
    library = (not record.pathname.startswith(_OWN_ROOT)
               and any(part in record.pathname for part in _LIBRARY_PATHS))
    if record.levelno >= std_logging.WARNING:
      if library and (_about_storage(record) or _metadata_denied(record)):
        return False  # the trainer says it in one line
      # orbax warns on every read-only manager (eval, warm start, non-chief workers).
      return not record.getMessage().startswith("Given directory is read only")
    return not library


def _metadata_denied(record: std_logging.LogRecord) -> bool:
  """orbax's 'Metadata file does not exist' for a step directory it may not read (the
  restore reports that as a permission error)."""
  message = record.getMessage()
  prefix = "Metadata file does not exist: "
  if not message.startswith(prefix):
    return False
  try:
    os.listdir(os.path.dirname(message[len(prefix):]))
  except PermissionError:
    return True
  except OSError:
    pass
  return False


def _about_storage(record: std_logging.LogRecord) -> bool:
  error = record.exc_info[1] if record.exc_info else None
  return bool(storage.reason_in_text(record.getMessage())
              or (error is not None and storage.reason(error)))


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


def hide_library_info() -> None:
  """Libraries' INFO lines off the absl logger, whoever handles its records: the CLI's
  absl handler, a notebook's or Ray worker's `logging.basicConfig` root handler (the
  Python API calls this too). Once per process; absl verbosity DEBUG shows them."""
  logger = logging.get_absl_logger()
  if not any(isinstance(f, _HideLibraryInfo) for f in logger.filters):
    logger.addFilter(_HideLibraryInfo())


def quiet_libraries() -> None:
  """Call once, after flags are parsed (so --verbosity is known) and before
  TensorFlow is imported (its C++ log level is read at import)."""
  verbose = native_output.quiet_tensorflow()
  if not verbose:
    hide_library_info()
    sys.stderr = _WithoutClosedLoopTracebacks(sys.stderr)
    # tf.data says this whenever a strategy distributes a dataset that has options.
    warnings.filterwarnings("ignore", message="To make it possible to preserve tf.data options")


