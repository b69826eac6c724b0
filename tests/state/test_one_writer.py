"""One writer per model_dir: the chief of train/train_and_eval holds model_dir/.lock;
a second writer exits 2 naming the holder; readers do not need it; SIGKILL leaves no
stale lock; with the lock held, the temporaries a killed save left are removed."""
import hashlib
import os
import re
import shutil
import signal
import socket

import pytest

from tests.support.cli import run_trainer, train_ok
from tests.support.processes import TrainerProcess, checkpoint_arrays
from trainer.store import model_dir as layout
from trainer.store import writer_lock
from trainer.errors import UserError

_FLAGS = ["--config=synthetic", "--config.train.global_batch_size=48",
          "--config.train.steps_per_loop=10", "--config.checkpoint.interval=20",
          "--config.data.num_train_examples=1000", "--config.data.num_eval_examples=500"]
_TEMPORARY = "35.orbax-checkpoint-tmp-1732345678901234"  # what a save killed at step 35 leaves


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  """A finished 40-step run, copied by each test that needs one."""
  model_dir = tmp_path_factory.mktemp("trained")
  train_ok(model_dir, *_FLAGS, "--config.train.steps=40")
  return model_dir


def _copy(trained, tmp_path):
  model_dir = tmp_path / "run"
  shutil.copytree(trained, model_dir)
  return model_dir


def _killed_save(model_dir):
  """An unfinished orbax step, as a kill during the save of step 35 leaves it."""
  temporary = model_dir / "checkpoints" / _TEMPORARY
  shutil.copytree(model_dir / "checkpoints" / "40", temporary)
  os.remove(temporary / "commit_success.txt")
  return temporary


def _digest(model_dir) -> dict:
  digests = {}
  for root, _, files in os.walk(model_dir):
    for name in files:
      path = os.path.join(root, name)
      with open(path, "rb") as f:
        digests[os.path.relpath(path, model_dir)] = hashlib.sha256(f.read()).hexdigest()
  return digests


def test_two_trainers_started_at_once_one_refused_the_other_finishes(tmp_path):
  flags = [*_FLAGS, "--config.train.steps=160"]
  first, second = TrainerProcess(tmp_path, *flags), TrainerProcess(tmp_path, *flags)
  try:
    codes = {first: first.wait(), second: second.wait()}
  finally:
    first.kill()
    second.kill()
  assert sorted(codes.values()) == [0, 2], [p.output[-2000:] for p in codes]
  refused = next(p for p, code in codes.items() if code == 2)
  winner = next(p for p, code in codes.items() if code == 0)
  errors = [line for line in refused.lines if line.startswith("distloop: error:")]
  assert len(errors) == 1 and "Traceback" not in refused.output, refused.output
  assert re.search(rf"is in use by another trainer \(host {re.escape(socket.gethostname())}, "
                   rf"pid {winner.process.pid}, since \d{{4}}-\d\d-\d\d \d\d:\d\d:\d\d",
                   errors[0]), errors[0]
  steps = sorted(int(name) for name in os.listdir(tmp_path / "checkpoints"))
  assert steps == [120, 140, 160]  # nothing but the winner's steps, nothing unfinished
  for step in steps:  # every checkpoint readable by plain orbax
    assert checkpoint_arrays(tmp_path, step)["model/mnist_cnn/conv/kernel"].shape == (3, 3, 1, 32)
  assert not (tmp_path / layout.LOCK_NAME).exists()


def test_a_held_lock_refuses_writers_not_readers_and_keeps_their_temporaries(trained, tmp_path):
  model_dir = _copy(trained, tmp_path)
  temporary = _killed_save(model_dir)
  lock = writer_lock.WriterLock.acquire(str(model_dir))  # this test process is the writer
  try:
    before = _digest(model_dir)
    refused = run_trainer(model_dir, *_FLAGS, "--config.train.steps=60")
    assert refused.returncode == 2, refused.stderr[-3000:]
    assert refused.error_lines() == [refused.error_lines()[0]]
    assert f"pid {os.getpid()}" in refused.stderr and "Traceback" not in refused.stderr
    assert _digest(model_dir) == before  # the holder's files, temporaries included, untouched

    for mode in ("eval", "export"):
      reader = run_trainer(model_dir, *_FLAGS, "--config.train.steps=40", f"--mode={mode}")
      assert reader.returncode == 0, reader.stderr[-3000:]
    assert temporary.is_dir()
  finally:
    lock.release()


def test_the_lock_holder_removes_temporaries_a_killed_save_left(trained, tmp_path):
  model_dir = _copy(trained, tmp_path)
  _killed_save(model_dir)
  result = run_trainer(model_dir, *_FLAGS, "--config.train.steps=60")
  assert result.returncode == 0, result.stderr[-3000:]
  assert "Removed 1 unfinished checkpoint(s) a killed save left in" in result.stderr
  assert sorted(os.listdir(model_dir / "checkpoints")) == ["20", "40", "60"]


def test_sigkill_leaves_no_stale_lock(tmp_path):
  flags = [*_FLAGS, "--config.train.steps=60"]
  process = TrainerProcess(tmp_path, *flags)
  try:
    process.wait_for(r"step 30/")
    process.send(signal.SIGKILL)
    assert process.wait() == -signal.SIGKILL
  finally:
    process.kill()
  assert (tmp_path / layout.LOCK_NAME).exists()  # the file stays; the lock does not
  resumed = run_trainer(tmp_path, *flags)
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert "in use by another trainer" not in resumed.stderr


def test_refused_run_leaves_no_model_dir_behind(trained, tmp_path):
  """Refused after the lock was taken (a warm start from another model): the model_dir
  that taking the lock created is gone again."""
  model_dir = tmp_path / "fresh"
  result = run_trainer(model_dir, *_FLAGS, "--config.model.dense_units=32",
                       f"--config.checkpoint.init_from={trained}")
  assert result.returncode == 2, result.stderr[-3000:]
  assert "written by a different model" in result.error_lines()[0]
  assert not model_dir.exists()


def test_lock_unit(tmp_path):
  model_dir = tmp_path / "new"
  lock = writer_lock.WriterLock.acquire(str(model_dir))
  assert lock.created_model_dir and (model_dir / layout.LOCK_NAME).exists()
  with pytest.raises(UserError, match=rf"in use by another trainer \(host .*, pid {os.getpid()}"):
    writer_lock.WriterLock.acquire(str(model_dir))  # flock: per open file, even in one process
  lock.release()
  assert model_dir.is_dir() and not (model_dir / layout.LOCK_NAME).exists()
  again = writer_lock.WriterLock.acquire(str(model_dir))
  assert not again.created_model_dir
  again.release(refused=True)
  assert model_dir.is_dir()  # it existed before this lock: kept

  fresh = tmp_path / "fresh"
  writer_lock.WriterLock.acquire(str(fresh)).release(refused=True)
  assert not fresh.exists()
