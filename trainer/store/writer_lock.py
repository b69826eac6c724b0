"""One writer per model_dir: an exclusive `flock` on model_dir/.lock for the whole run.

Two trainers on one model_dir (a scheduler restarting a job it thinks is dead, a
command run twice) would delete each other's orbax temporaries and retain or
delete each other's steps. The chief of `train`/`train_and_eval` holds this lock
from after validation to exit; a second writer exits 2 naming the holder (host,
pid, since when). Readers (eval, continuous_eval, export) and non-chief workers
never take it. The kernel releases the lock when the process dies, SIGKILL
included, so a stale `.lock` file means nothing: only a held lock counts.

On NFS, Linux implements flock() with byte-range (POSIX) locks, which NFSv4 (and
NFSv3 with lockd) makes exclusive across machines; a file system that cannot
lock (ENOLCK, EOPNOTSUPP) gets a warning and no lock. The file is removed when
the lock is released; `acquire` re-checks that the file it locked is still the
one at the path, so a release racing an acquire never yields two holders.
"""
import errno
import json
import os
import shutil
import socket
import time

from absl import logging

from trainer.store import lease
from trainer.store import mirror
from trainer.store import model_dir as layout
from trainer.store import record
from trainer.store import storage
from trainer.errors import UserError

_NO_LOCKS = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS)


class WriterLock:
  """Held from `acquire()` to `release()`; `created_model_dir` says whether acquiring
  created model_dir (so a run refused afterwards can leave nothing behind)."""

  def __init__(self, path: str, fd: int | None, created_model_dir: bool):
    self.path = path
    self._fd = fd
    self.created_model_dir = created_model_dir

  @classmethod
  def acquire(cls, model_dir: str, *, lease_seconds: float = 60.0):
    """Locks model_dir (creating it if needed); UserError naming the holder if it is held.
    A bucket model_dir (staged: trainer/store/mirror.py) is locked by a lease instead
    (trainer/store/lease.py: the same refusals, and a dead holder's lease expires)."""
    import fcntl  # pylint: disable=g-import-not-at-top  (POSIX only)
    bucket = mirror.of(model_dir)
    if bucket is not None:
      return lease.BucketLease.acquire(bucket, lease_seconds)
    created = not os.path.isdir(model_dir)
    path = layout.lock_path(model_dir)
    try:
      os.makedirs(model_dir, exist_ok=True)
    except OSError as e:  # /proc/x: ENOENT; a read-only parent: EROFS (exit 2, one line)
      raise storage.start_up_failure(None, model_dir, e) from None
    try:
      while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        record.note(path, "lock")
        try:
          fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
          os.close(fd)
          raise UserError(f"--model_dir={model_dir} is in use by another trainer "
                          f"({_holder(path)}); only one may write it: wait for that one to "
                          f"end, or stop it, or use another --model_dir") from None
        except OSError as e:
          os.close(fd)
          if e.errno not in _NO_LOCKS:
            raise
          logging.warning("cannot lock %s (%s): make sure only one trainer writes %s",
                          path, os.strerror(e.errno), model_dir)
          return cls(path, None, created)
        if _same_file(fd, path):  # not removed by a holder releasing it meanwhile
          break
        os.close(fd)
      os.ftruncate(fd, 0)
      os.write(fd, json.dumps({"host": socket.gethostname(), "pid": os.getpid(),
                               "since": time.strftime("%Y-%m-%d %H:%M:%S %z")}).encode())
    except OSError as e:  # /proc/self: ENOENT; a read-only model_dir: EROFS (exit 2)
      if created:  # a refused run leaves no model_dir behind
        shutil.rmtree(model_dir, ignore_errors=True)
      raise storage.start_up_failure("the writer lock", path, e) from None
    return cls(path, fd, created)

  def release(self, *, refused: bool = False) -> None:
    """Removes the lock file, then unlocks. `refused`: the run was bad input and wrote
    nothing worth keeping (the caller knows what that is), so a model_dir that
    acquiring created is removed too, with what the refused run put in it (its
    config.json, an empty tensorboard/): a refused run leaves no model_dir behind."""
    model_dir = os.path.dirname(self.path)
    if refused and self.created_model_dir and self._fd is not None:
      shutil.rmtree(model_dir, ignore_errors=True)  # still locked: nobody else writes it
    if self._fd is not None:
      try:
        os.remove(self.path)
      except OSError:
        pass
      os.close(self._fd)
      self._fd = None
    if refused and self.created_model_dir:
      try:
        os.rmdir(model_dir)
      except OSError:
        pass  # something else is in it now: keep it


def _same_file(fd: int, path: str) -> bool:
  try:
    return os.stat(path).st_ino == os.fstat(fd).st_ino
  except FileNotFoundError:
    return False


def _holder(path: str) -> str:
  """'host h, pid 12, since 2025-01-01 10:00:00 +0000' from the lock file."""
  for _ in range(50):  # the holder writes it right after locking: give it a moment
    try:
      with open(path) as f:
        holder = json.loads(f.read() or "null")
    except (OSError, ValueError):
      holder = None
    if holder:
      return f"host {holder['host']}, pid {holder['pid']}, since {holder['since']}"
    time.sleep(0.01)
  return f"its host and pid are not in {path} yet"
