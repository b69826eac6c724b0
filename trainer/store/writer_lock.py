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
the lock is released; the lock re-checks that the file it locked is still the
one at the path, so a release racing an acquire never yields two holders. The flock
itself is the store's one lock (trainer/store/files.py), which predict's output shares.
"""
import os
import shutil

from trainer.store import files
from trainer.store import lease
from trainer.store import mirror
from trainer.store import model_dir as layout
from trainer.store import storage


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
      fd = files.lock(path, f"--model_dir={model_dir} is in use by another trainer ({{holder}}); "
                            f"only one may write it: wait for that one to end, or stop it, or "
                            f"use another --model_dir")
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
    fd, self._fd = self._fd, None
    files.unlock(fd, self.path)
    if refused and self.created_model_dir:
      try:
        os.rmdir(model_dir)
      except OSError:
        pass  # something else is in it now: keep it
