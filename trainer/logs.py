"""Terminal output: distloop's progress at INFO, libraries' INFO chatter hidden.

orbax logs a dozen INFO lines per checkpoint and TensorFlow a few per export,
through the same absl handler as our progress lines. Their warnings and errors
always show; their INFO lines only with --verbosity=1 or more.
"""
import contextlib
import logging as std_logging
import os
import sys
import warnings

from absl import logging

_LIBRARY_PATHS = ("/orbax/", "/tensorflow/", "/keras/", "/jax/", "/etils/")


class _HideLibraryInfo(std_logging.Filter):

  def filter(self, record: std_logging.LogRecord) -> bool:
    if record.levelno >= std_logging.WARNING:
      return True
    return not any(part in record.pathname for part in _LIBRARY_PATHS)


def quiet_libraries() -> None:
  """Call once, after flags are parsed (so --verbosity is known)."""
  if logging.get_verbosity() < logging.DEBUG:
    logging.get_absl_handler().addFilter(_HideLibraryInfo())
    # tf.data says this whenever a strategy distributes a dataset that has options.
    warnings.filterwarnings("ignore", message="To make it possible to preserve tf.data options")


@contextlib.contextmanager
def native_startup_silenced():
  """Hides file descriptor 2 while TensorFlow loads and finds its devices.

  TensorFlow 2.21 prints its C++ start-up lines (oneDNN, CUDA probing) before
  absl::InitializeLog, so TF_CPP_MIN_LOG_LEVEL cannot hide them. Python
  exceptions still surface (they are printed after the block); --verbosity=1
  shows everything.
  """
  if logging.get_verbosity() >= logging.DEBUG:
    yield
    return
  sys.stderr.flush()
  saved_fd = os.dup(2)
  null_fd = os.open(os.devnull, os.O_WRONLY)
  os.dup2(null_fd, 2)
  try:
    yield
  finally:
    sys.stderr.flush()
    os.dup2(saved_fd, 2)
    os.close(saved_fd)
    os.close(null_fd)
