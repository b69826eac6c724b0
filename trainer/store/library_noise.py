"""What libraries print, in one place: the chatter hidden, and the echoes of a failure
distloop reports itself dropped, everything else left to show.

- **INFO chatter** (`hide_library_info`, in every entry point: the CLI, trainer.run in a
  notebook or a Ray worker, the launcher's processes): orbax logs a dozen lines per
  checkpoint and TensorFlow a few per export, through the same absl logger as distloop's
  progress lines. Their warnings and errors always show, except orbax's own records about
  a failed write or an unreadable step (the trainer reports it in one line:
  trainer/store/storage.py).
- **Echoes of a failed write** (`quiet_failed_writes`): orbax writes a step as many
  tensorstore writes awaited on a private asyncio loop. When one fails (a full disk), orbax
  raises that error and closes the loop while the others are still under way, and each of
  them echoes the same failure later, from threads and finalizers we do not call: asyncio
  logs "Task exception was never retrieved" with the write's own ENOSPC traceback when the
  abandoned task is collected; tensorstore, finishing a write, wakes the closed loop with
  `loop.call_soon_threadsafe` and reports the RuntimeError ("Event loop is closed") as
  unraisable, or prints its traceback from C (`WithoutClosedLoopTracebacks`, the CLI's
  stderr). Any other unraisable error or asyncio record still prints.
- **Echoes of a failed read**: its pending tensorstore callbacks print asyncio tracebacks
  to fd 2 from other threads for a moment; the restore runs under `stderr_captured()` and
  discards what they print (trainer/state/train_state.py), and `after_failed_read(dir)`
  drops asyncio's "never retrieved" records of that step's reads, which the garbage
  collector may log any time later.

trainer/cli/logs.py applies these to the terminal (and TensorFlow's C++ log level).
"""
import logging as std_logging
import os
import sys
import threading
import traceback

from absl import logging

from input_pipelines.native_output import stderr_captured  # noqa: F401  (fd 2, held)
from trainer.store import storage

_CLOSED_LOOP = "Event loop is closed"  # what a late tensorstore callback finds


# -- INFO chatter ---------------------------------------------------------------------

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


# -- echoes of a failed write or read -----------------------------------------------

_failed_reads = set()  # step directories whose failed reads may still echo


def after_failed_read(step_dir: str) -> None:
  """The read of `step_dir` failed (reported as one line): its abandoned reads' late
  'exception was never retrieved' records are dropped; nothing else is."""
  _failed_reads.add(step_dir.rstrip("/"))
  quiet_failed_writes()


def quiet_failed_writes() -> None:
  """Installs both echo filters once per process (idempotent)."""
  if not getattr(sys.unraisablehook, "drops_late_wakeups", False):
    sys.unraisablehook = _without_late_wakeups(sys.unraisablehook)
  asyncio_logger = std_logging.getLogger("asyncio")
  if _drop_abandoned_storage_failures not in asyncio_logger.filters:
    asyncio_logger.addFilter(_drop_abandoned_storage_failures)


def _without_late_wakeups(previous):
  def hook(unraisable):
    if not _is_late_wakeup_of_a_closed_loop(unraisable.exc_value, unraisable.exc_traceback):
      previous(unraisable)
  hook.drops_late_wakeups = True
  hook.__wrapped__ = previous
  return hook


def _is_late_wakeup_of_a_closed_loop(error: BaseException | None, trace) -> bool:
  if not isinstance(error, RuntimeError) or str(error) != _CLOSED_LOOP:
    return False
  return any(frame.f_code.co_name == "call_soon_threadsafe"
             for frame, _ in traceback.walk_tb(trace))


def _drop_abandoned_storage_failures(record: std_logging.LogRecord) -> bool:
  """False (drop) for asyncio's 'exception was never retrieved' of a storage failure."""
  error = record.exc_info[1] if record.exc_info else None
  abandoned = "exception was never retrieved" in record.getMessage()
  of_a_failed_read = error is not None and any(directory in str(error)
                                               for directory in _failed_reads)
  return not (abandoned and (storage.reason(error) or of_a_failed_read))


class WithoutClosedLoopTracebacks:
  """sys.stderr minus the traceback tensorstore prints (from C, piece by piece) for
  each callback that completes after orbax closed its asyncio loop, as after a failed
  write: noise, the failure itself is reported. Other text passes through at once; a
  traceback is held only until its exception line shows which one it is."""

  _HEADER = "Traceback (most recent call last):"
  _NOISE = f"RuntimeError: {_CLOSED_LOOP}"

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
