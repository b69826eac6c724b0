"""Terminal output: distloop's progress at INFO, libraries' INFO chatter hidden.

orbax logs a dozen INFO lines per checkpoint and TensorFlow a few per export,
through the same absl handler as our progress lines. Their Python warnings and
errors always show; their INFO lines, and TensorFlow's C++ log (harmless
internal messages even at ERROR level), only with --verbosity=1 or more.
A TF_CPP_MIN_LOG_LEVEL set by the user is respected.
"""
import contextlib
import logging as std_logging
import os
import sys
import tempfile
import warnings

from absl import logging

_LIBRARY_PATHS = ("/orbax/", "/tensorflow/", "/keras/", "/jax/", "/etils/")


class _HideLibraryInfo(std_logging.Filter):

  def filter(self, record: std_logging.LogRecord) -> bool:
    if record.levelno >= std_logging.WARNING:
      # orbax warns on every read-only manager (eval, warm start, non-chief workers).
      return not record.getMessage().startswith("Given directory is read only")
    return not any(part in record.pathname for part in _LIBRARY_PATHS)


def quiet_libraries() -> None:
  """Call once, after flags are parsed (so --verbosity is known) and before
  TensorFlow is imported (its C++ log level is read at import)."""
  verbose = logging.get_verbosity() >= logging.DEBUG
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "0" if verbose else "3")
  if not verbose:
    logging.get_absl_handler().addFilter(_HideLibraryInfo())
    # tf.data says this whenever a strategy distributes a dataset that has options.
    warnings.filterwarnings("ignore", message="To make it possible to preserve tf.data options")


class CapturedStderr:
  """What file descriptor 2 received inside `stderr_captured()`; replayed unless discarded."""

  def __init__(self):
    self.keep = True

  def discard(self) -> None:
    self.keep = False


@contextlib.contextmanager
def stderr_captured():
  """Redirects file descriptor 2 (C/C++ writers included) to a temporary file.

  On exit the captured bytes are written to the real stderr, unless the block
  called `.discard()` on the yielded CapturedStderr.
  """
  captured = CapturedStderr()
  sys.stderr.flush()
  saved_fd = os.dup(2)
  with tempfile.TemporaryFile() as buffer:
    os.dup2(buffer.fileno(), 2)
    try:
      yield captured
    finally:
      sys.stderr.flush()
      os.dup2(saved_fd, 2)
      os.close(saved_fd)
      if captured.keep:
        buffer.seek(0)
        sys.stderr.write(buffer.read().decode(errors="replace"))
        sys.stderr.flush()


@contextlib.contextmanager
def native_startup_silenced():
  """Hides file descriptor 2 while TensorFlow loads and finds its devices.

  TensorFlow 2.21 prints its C++ start-up lines (oneDNN, CUDA probing) before
  absl::InitializeLog, so TF_CPP_MIN_LOG_LEVEL cannot hide them. Python
  exceptions still surface (they are printed after the block); --verbosity=1
  shows everything.
  """
  with stderr_captured() as captured:
    if logging.get_verbosity() < logging.DEBUG:
      captured.discard()
    yield
