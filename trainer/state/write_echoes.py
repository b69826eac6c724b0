"""Keeps a failed checkpoint write to its one line on stderr.

orbax writes a step as many tensorstore writes awaited on a private asyncio loop.
When one fails (a full disk), orbax raises that error and closes the loop while the
others are still under way, and each of them echoes the same failure later, from
threads and finalizers we do not call:

- asyncio logs "Task exception was never retrieved" (or "Future ...") with the
  write's own ENOSPC traceback when the abandoned task is collected;
- tensorstore, finishing a write, wakes the closed loop with
  `loop.call_soon_threadsafe` and reports the RuntimeError as unraisable.

The failure itself reaches the CLI as one StorageError line (trainer/store/storage.py).
`quiet()` drops exactly these echoes; any other unraisable error or asyncio log
record, including a never-retrieved error that is not a storage failure, still prints.

A failed read echoes too: its pending tensorstore callbacks print asyncio tracebacks
to fd 2 from other threads for a moment; the restore runs under `stderr_captured()`
and discards what they print (trainer/state/train_state.py), and `after_failed_read(dir)`
drops asyncio's "never retrieved" records of that unreadable step's reads, which the
garbage collector may log any time later. The rest of the libraries'
terminal chatter is trainer/cli/logs.py's.
"""
import logging
import sys
import traceback

from input_pipelines.native_output import stderr_captured  # noqa: F401  (fd 2, held)
from trainer.store import storage


_failed_reads = set()  # step directories whose failed reads may still echo


def after_failed_read(step_dir: str) -> None:
  """The read of `step_dir` failed (reported as one line): its abandoned reads' late
  'exception was never retrieved' records are dropped; nothing else is."""
  _failed_reads.add(step_dir.rstrip("/"))
  quiet()


def quiet() -> None:
  """Installs both filters once per process (idempotent)."""
  if not getattr(sys.unraisablehook, "drops_late_wakeups", False):
    sys.unraisablehook = _without_late_wakeups(sys.unraisablehook)
  asyncio_logger = logging.getLogger("asyncio")
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
  if not isinstance(error, RuntimeError) or str(error) != "Event loop is closed":
    return False
  return any(frame.f_code.co_name == "call_soon_threadsafe"
             for frame, _ in traceback.walk_tb(trace))


def _drop_abandoned_storage_failures(record: logging.LogRecord) -> bool:
  """False (drop) for asyncio's 'exception was never retrieved' of a storage failure."""
  error = record.exc_info[1] if record.exc_info else None
  abandoned = "exception was never retrieved" in record.getMessage()
  of_a_failed_read = error is not None and any(directory in str(error)
                                               for directory in _failed_reads)
  return not (abandoned and (storage.reason(error) or of_a_failed_read))
