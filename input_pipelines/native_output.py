"""TensorFlow's native output, hidden unless --verbosity=1: the converter
(input_pipelines/records/convert.py) and the trainer (trainer/cli/logs.py) both load TensorFlow.

TensorFlow's C++ log level is read when it is imported, and TensorFlow 2.21
prints its start-up lines (oneDNN, CUDA probing) before absl::InitializeLog, so
only a redirect of file descriptor 2 hides those. Here, under input_pipelines,
because the converter may import nothing from trainer/.
"""
import contextlib
import os
import sys
import tempfile

from absl import logging


def quiet_tensorflow() -> bool:
  """TF_CPP_MIN_LOG_LEVEL from --verbosity, unless the user set it; call after the flags
  are parsed and before TensorFlow is imported. Returns whether output is verbose."""
  verbose = logging.get_verbosity() >= logging.DEBUG
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "0" if verbose else "3")
  return verbose


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
