"""Libraries' INFO lines hidden in every entry point (the CLI, trainer.run in a notebook
or a Ray worker, the launcher's processes): orbax logs a dozen per checkpoint and
TensorFlow a few per export, through the same absl logger as distloop's progress lines.
Their warnings and errors always show, except orbax's own records about a failed write
(the trainer reports it in one line: trainer/store/storage.py)."""
import logging as std_logging
import os

from absl import logging

from trainer.store import storage

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


def hide_library_info(handler: std_logging.Handler | None = None) -> None:
  """Libraries' INFO lines off the absl logger, whoever handles its records: the CLI's
  absl handler, a notebook's or Ray worker's `logging.basicConfig` root handler (the
  Python API calls this too); JAX's own loggers (orbax imports it: "Unable to
  initialize backend 'tpu'") at WARNING unless their level is set. `handler`: filter
  every record it gets too (the CLI's own handler). Once per process; absl verbosity
  DEBUG shows them."""
  for owner in (logging.get_absl_logger(), handler):
    if owner is not None and not any(isinstance(f, _HideLibraryInfo) for f in owner.filters):
      owner.addFilter(_HideLibraryInfo())
  jax = std_logging.getLogger("jax")
  if jax.level == std_logging.NOTSET:
    jax.setLevel(std_logging.WARNING)
