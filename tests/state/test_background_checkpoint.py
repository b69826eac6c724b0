"""An async checkpoint is written by one writer thread, off the training thread.

What training relies on: save() returns at once, however slow the disk; the step list
it reads afterwards includes that step; a write that fails in the background is
reported, once, as the one-line storage error naming its step.
"""
import errno
import os
import threading
import time

import numpy as np
import orbax.checkpoint as ocp
import pytest

from trainer.state import checkpoints
from trainer.errors import StorageError


def _state(value: float):
  model = {"dense": {"kernel": np.full((4, 3), value, np.float32)}}
  optimizer = {"iterations": np.asarray(int(value), np.int64)}
  return model, optimizer, {"step": int(value)}


def _manager(tmp_path):
  return checkpoints.Checkpoints(str(tmp_path / "checkpoints"), max_to_keep=3,
                                 async_save=True, writer=True)


@pytest.fixture
def gated_orbax(monkeypatch):
  """orbax's save waits for `gate`; `seen` records the thread it ran on."""
  gate, seen = threading.Event(), {}
  real_save = ocp.CheckpointManager.save

  def save(self, *args, **kwargs):
    seen["thread"] = threading.current_thread().name
    assert gate.wait(timeout=60)
    return real_save(self, *args, **kwargs)

  monkeypatch.setattr(ocp.CheckpointManager, "save", save)
  return gate, seen


def test_save_returns_while_the_write_is_still_under_way(tmp_path, gated_orbax):
  gate, seen = gated_orbax
  manager = _manager(tmp_path)
  try:
    start = time.perf_counter()
    manager.save(10, *_state(10))
    assert not gate.is_set() and time.perf_counter() - start < 5
    assert not os.path.exists(tmp_path / "checkpoints" / "10")  # still being written
    threading.Timer(0.5, gate.set).start()
    assert manager.latest_step() == 10  # waits for the writer, then sees its step
    assert manager.all_steps() == [10]
    assert seen["thread"].startswith("checkpoint_writer")
    manager.wait()
    restored, _, meta = manager.restore(10, _state(0)[0], None)
    np.testing.assert_array_equal(restored["dense"]["kernel"], _state(10)[0]["dense"]["kernel"])
    assert meta["step"] == 10
  finally:
    gate.set()
    manager.close()


def test_a_failed_background_write_is_reported_once_by_wait(tmp_path, monkeypatch):
  def disk_full(self, *args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")

  manager = _manager(tmp_path)
  manager.save(10, *_state(10))
  manager.wait()
  monkeypatch.setattr(ocp.CheckpointManager, "save", disk_full)
  try:
    manager.save(20, *_state(20))  # returns: the failure happens on the writer thread
    with pytest.raises(StorageError, match=r"checkpoint of step 20.*No space left"):
      manager.wait()
    manager.wait()  # reported once
    assert manager.latest_step() == 10
  finally:
    manager.close()
