"""Terminal output: distloop's progress at INFO, libraries' INFO chatter hidden.

Libraries' INFO lines (trainer/store/library_noise.py, as for the Python API) and
TensorFlow's C++ log (harmless internal messages even at ERROR level) show only with
--verbosity=1 or more.
A TF_CPP_MIN_LOG_LEVEL set by the user is respected.

A checkpoint write that fails for lack of space or permission is reported by
the trainer as one line (trainer/store/storage.py); orbax's own error records about
it (tracebacks from its background threads) and tensorstore's late asyncio
callbacks ("Event loop is closed") are hidden unless --verbosity=1.
"""
import sys
import warnings

from absl import logging

from input_pipelines import native_output
from input_pipelines.native_output import native_startup_silenced  # noqa: F401
from trainer.store import library_noise


def quiet_libraries() -> None:
  """Call once, after flags are parsed (so --verbosity is known) and before
  TensorFlow is imported (its C++ log level is read at import)."""
  verbose = native_output.quiet_tensorflow()
  if not verbose:
    library_noise.hide_library_info(logging.get_absl_handler())
    sys.stderr = library_noise.WithoutClosedLoopTracebacks(sys.stderr)
    # tf.data says this whenever a strategy distributes a dataset that has options.
    warnings.filterwarnings("ignore", message="To make it possible to preserve tf.data options")


