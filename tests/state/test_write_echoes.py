"""A checkpoint write failing on a full disk is one line on stderr.

orbax abandons the other writes of that step when one fails; as they finish they
echo the failure (an unraisable RuntimeError from tensorstore waking orbax's closed
event loop; asyncio's "exception was never retrieved" with the ENOSPC traceback).
Both printed tracebacks beside the one-line error in CI, now and then. A writing
Checkpoints manager drops exactly those echoes; the end-to-end check is
tests/state/test_storage_errors.py.
"""
import asyncio
import gc
import logging
import sys

import pytest

from trainer.state import checkpoints
from trainer.store import library_noise

_DISK_FULL = ValueError("RESOURCE_EXHAUSTED: Error writing \"adam/0\" in OCDBT database: "
                        "Failed to write 1432867 bytes to file 20: No space left on device "
                        "[os_error_code='28']")


@pytest.fixture
def writing_manager(tmp_path, monkeypatch):
  """Constructs a writing manager with this test's unraisable hook and asyncio filters."""
  reported = []
  monkeypatch.setattr(sys, "unraisablehook", reported.append)
  monkeypatch.setattr(logging.getLogger("asyncio"), "filters", [])
  checkpoints.Checkpoints(str(tmp_path / "checkpoints"), max_to_keep=1, async_save=True,
                          writer=True).close()
  return reported


def _unraisable(error: BaseException):
  return type("UnraisableHookArgs", (), {"exc_type": type(error), "exc_value": error,
                                         "exc_traceback": error.__traceback__,
                                         "err_msg": None, "object": None})()


def _wakeup_of_a_closed_loop() -> RuntimeError:
  loop = asyncio.new_event_loop()
  loop.close()
  try:
    loop.call_soon_threadsafe(print)
  except RuntimeError as e:
    return e
  raise AssertionError("a closed loop accepted a callback")


def test_a_late_wakeup_of_a_closed_loop_is_dropped_and_nothing_else(writing_manager):
  reported = writing_manager
  other = RuntimeError("Event loop is closed")  # the same words, not from a wake-up: kept
  for error in (_wakeup_of_a_closed_loop(), other, ValueError("anything else")):
    sys.unraisablehook(_unraisable(error))
  assert [type(args.exc_value) for args in reported] == [RuntimeError, ValueError]
  assert reported[0].exc_value is other


def test_a_second_manager_does_not_wrap_the_filter_again(writing_manager, tmp_path):
  checkpoints.Checkpoints(str(tmp_path / "again"), max_to_keep=1, async_save=True,
                          writer=True).close()
  assert sys.unraisablehook.__wrapped__ == writing_manager.append
  assert len(logging.getLogger("asyncio").filters) == 1


def _abandon_a_failed_task(error: Exception) -> None:
  """What orbax leaves behind: a task that failed and whose error nobody retrieved."""
  async def write():
    raise error

  loop = asyncio.new_event_loop()
  task = loop.create_task(write())
  loop.run_until_complete(asyncio.sleep(0.01))
  assert task.done()
  del task
  gc.collect()  # asyncio logs "Task exception was never retrieved" when the task goes
  loop.close()


def test_an_abandoned_storage_failure_is_not_logged_and_other_errors_are(writing_manager,
                                                                         caplog):
  with caplog.at_level(logging.ERROR, logger="asyncio"):
    _abandon_a_failed_task(_DISK_FULL)
    assert not caplog.records
    _abandon_a_failed_task(ValueError("a bug, not the disk"))
  assert ["never retrieved" in record.getMessage() for record in caplog.records] == [True]
  assert "a bug, not the disk" in caplog.text


def test_a_failed_reads_late_echo_is_dropped_and_other_reads_are_not(tmp_path):
  """The garbage collector may log an abandoned read of an unreadable step long after the
  restore moved on: dropped for that step's directory only."""
  import logging  # pylint: disable=import-outside-toplevel
  library_noise.after_failed_read(str(tmp_path / "checkpoints" / "60"))
  def record(error):
    return logging.LogRecord("asyncio", logging.ERROR, __file__, 1,
                             "Task exception was never retrieved", None,
                             (type(error), error, None))
  late = ValueError(f'NOT_FOUND: Error opening "zarr" driver: Metadata at "x/.zarray" in '
                    f'OCDBT database at local file "{tmp_path}/checkpoints/60/model/" ...')
  other = ValueError(f'NOT_FOUND: ... local file "{tmp_path}/checkpoints/40/model/"')
  assert library_noise._drop_abandoned_storage_failures(record(late)) is False  # pylint: disable=protected-access
  assert library_noise._drop_abandoned_storage_failures(record(other)) is True  # pylint: disable=protected-access
