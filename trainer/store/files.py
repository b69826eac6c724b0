"""The one way a file gets under model_dir: written whole, then renamed into place.

Every writer in distloop (config.json and the other JSON files, metrics.csv's rewind,
TensorBoard's rewound event files, the MLflow run file, the predictions' chunks and
progress, the SavedModel export, verify's digests) calls this module; nothing else
under trainer/ renames, locks or opens a file for writing (tests/docs/test_layout.py).
What it promises, on every path:

  - a reader sees the old file or the new one, never half of one: the bytes go to a
    temporary beside the target, are fsynced, then renamed over it;
  - a full disk or a denied write is a StorageError naming the path (one line, exit 1),
    and the previous file is left as it was (the temporary is removed);
  - in a bucket model_dir's staging folder the finished file (or folder) is put in the
    bucket as a whole object (trainer/store/mirror.py), `last` naming what goes last;
  - JSON is strict: a non-finite number is written as null, and said in the log.

Appended files (metrics.csv, verify/digests.jsonl) go through `Appender`: each write
flushed, whole rows pushed to the bucket at each checkpoint and at the end.
"""
import errno
import json
import math
import os
import socket
import time

from absl import logging

from trainer.errors import UserError
from trainer.store import mirror
from trainer.store import record
from trainer.store import storage


def temporary(path: str) -> str:
  """The temporary `path` is written to: hidden, beside it (the same file system, so the
  rename is atomic). An event file's is not named like one: TensorBoard reads any file
  whose name holds "tfevents", a half-written one too."""
  name = os.path.basename(path)
  hidden = ".restarting" if "tfevents" in name else f".{name}.tmp"
  return os.path.join(os.path.dirname(path), hidden)


def write_bytes(path: str, data: bytes, *, what: str | None = None,
                where: str | None = None) -> None:
  """`data` as the whole of `path` (see the module docstring); the one-line error says
  `cannot write WHAT to WHERE` (default: the file's name, its path)."""
  staged = temporary(path)
  try:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(staged, "wb") as f:
      f.write(data)
      f.flush()
      os.fsync(f.fileno())  # on disk before it is renamed into place (and before a quick exit)
    os.replace(staged, path)
  except OSError as error:
    _remove(staged)
    if storage.reason(error) is None:
      raise
    raise storage.failure(what or os.path.basename(path), where or path, error,
                          needed_bytes=len(data)) from None
  record.note(path, "written")
  published(path)


def write_text(path: str, text: str, *, what: str | None = None,
               where: str | None = None) -> None:
  write_bytes(path, text.encode("utf-8"), what=what, where=where)


def write_json(path: str, value, *, what: str | None = None, where: str | None = None,
               indent: int = 2, sort_keys: bool = True) -> None:
  """`value` as strict JSON (`json_text`), one line feed at the end."""
  name = what or os.path.basename(path)
  write_text(path, json_text(value, name, indent=indent, sort_keys=sort_keys) + "\n",
             what=name, where=where)


def read_json(path: str):
  """The JSON at `path`; None if it is missing or not JSON."""
  try:
    with open(path, encoding="utf-8") as f:
      return json.load(f)
  except (OSError, ValueError):
    return None


def json_text(value, what: str, **options) -> str:
  """`value` as strict JSON: a non-finite float (an eval value that is NaN) is written
  as null, and said in the log (naming `what` and the key), never as bare NaN, which
  no JSON parser but Python's reads."""
  def finite(item, key):
    if isinstance(item, float) and not math.isfinite(item):
      logging.warning("%s: %s is %s (not finite); written as null", what, key, item)
      return None
    if isinstance(item, dict):
      return {k: finite(v, f"{key}.{k}" if key else k) for k, v in item.items()}
    if isinstance(item, (list, tuple)):
      return [finite(v, f"{key}[{i}]") for i, v in enumerate(item)]
    return item
  return json.dumps(finite(value, ""), allow_nan=False, **options)


def commit(staged: str, path: str, *, what: str, where: str | None = None,
           needed_bytes: int | None = None, last: tuple[str, ...] = ()) -> None:
  """A file or folder a library wrote at `staged` (the SavedModel exporter's, a Parquet
  writer's) becomes `path`: fsynced, renamed into place, then put in the bucket (a
  folder's files named in `last` after all the others: an upload cut short is no
  SavedModel). On a full or denied disk `staged` is removed and a StorageError raised."""
  try:
    _fsync_tree(staged)
    os.replace(staged, path)
  except OSError as error:
    discard(staged)
    if storage.reason(error) is None:
      raise
    raise storage.failure(what, where or path, error, needed_bytes=needed_bytes) from None
  record.note(path, "committed", folder=os.path.isdir(path))
  bucket = mirror.of(path)
  if bucket is not None and os.path.isdir(path):
    bucket.push_tree(path, last=last)
  elif bucket is not None:
    published(path)


def move(source: str, destination: str) -> None:
  """A folder under model_dir set aside at `destination` (an unreadable checkpoint step),
  kept whole: renamed on disk, and put in the bucket at its new place."""
  os.makedirs(os.path.dirname(destination), exist_ok=True)
  os.replace(source, destination)
  record.note(destination, "moved", folder=True)
  bucket = mirror.of(destination)
  if bucket is not None:
    bucket.push_tree(destination)


def published(path: str) -> None:
  """A file written whole at its place (here, or by a library that renames it into
  place itself: a records shard or manifest): put in the bucket as one object, if
  model_dir (or the folder) is one."""
  record.note(path, "published")
  bucket = mirror.of(path)
  if bucket is not None:
    bucket.push_file(path)


def remove(path: str) -> None:
  """A file that is no longer part of a folder: gone here and from the bucket."""
  _remove(path)
  bucket = mirror.of(path)
  if bucket is not None:
    bucket.remove(path)


def staged_folder(path: str, what: str) -> str:
  """The local folder a writer writes `path` through: `path` itself; for a gs:// or
  s3:// URL (predict.output), its staging folder. Under a bucket (the URL, or a folder
  of a bucket model_dir) every object the bucket holds there is fetched first: what a
  rerun goes on from."""
  local = mirror.staged(path, what, fresh=False)
  bucket = mirror.of(local)
  if bucket is not None:
    bucket.pull_tree(local)
  return local


# Folders a library writes its own files into, each put in place by the library itself
# (orbax's checkpoint steps, TensorBoard's event files, the profiler's trace): the store
# hands the folder out, and puts in the bucket what the library finished.

def in_bucket(path: str) -> bool:
  """Whether `path` is in a bucket model_dir's staging folder (what is here is a copy)."""
  return mirror.of(path) is not None


def library_folder(path: str, library: str) -> str:
  """`path`, handed to `library` to write its own files into (recorded as its)."""
  record.note(path, "library", folder=True, library=library)
  return path


def step_finished(directory: str, step: int) -> None:
  """orbax finished step `step` of `directory`: on a bucket, its files, the logs, then
  its commit marker are put there (mirror.commit_step)."""
  bucket = mirror.of(directory)
  if bucket is not None:
    bucket.commit_step(directory, step)


def forget_unfinished_steps(directory: str) -> None:
  """The bucket's steps of `directory` that are not here (retention, a step set aside,
  a save cut short) go from the bucket, marker first."""
  bucket = mirror.of(directory)
  if bucket is not None:
    bucket.forget_steps(directory)


def fetch_new_steps(path: str) -> None:
  """A reader of a bucket model_dir that another process writes (continuous_eval, a
  worker rolling back): the steps committed there since, finished.json, summary.json."""
  bucket = mirror.of(path)
  if bucket is not None:
    bucket.refresh()


def put_logs(path: str) -> None:
  """metrics.csv's whole lines and the event files that changed, into the bucket (a
  writer does this at each checkpoint; an eval mode, which saves none, after its eval)."""
  bucket = mirror.of(path)
  if bucket is not None:
    bucket.push_logs()


def fetch_logs(directory: str) -> None:
  """The bucket's event files of `directory` that are not here yet (a resume rewinds
  them)."""
  bucket = mirror.of(directory)
  if bucket is not None:
    bucket.pull_logs(directory)


class FolderLock:
  """One writer of a folder (a predictions' output): flock on its `.lock` on a disk, a
  lease on a bucket (trainer/store/lease.py). Released by `release()`, or by the process's
  end (the kernel drops a flock; a lease expires)."""

  def __init__(self, path: str, fd: int | None = None, lease=None):
    self._path, self._fd, self._lease = path, fd, lease

  def release(self) -> None:
    fd, self._fd = self._fd, None
    unlock(fd, self._path)
    if self._lease is not None:
      lease, self._lease = self._lease, None
      lease.release()


def lock_folder(directory: str, refusal: str, *, lease_seconds: float) -> FolderLock:
  """The folder's one-writer lock; UserError(`refusal`, and on a bucket the holder) if
  another process holds it."""
  bucket = mirror.of(directory)
  path = os.path.join(directory, ".lock")
  if bucket is None:
    return FolderLock(path, fd=lock(path, f"{refusal} ({{holder}})"))
  from trainer.store import lease  # pylint: disable=g-import-not-at-top
  return FolderLock(path, lease=lease.BucketLease.acquire(bucket, lease_seconds,
                                                          folder=directory, refusal=refusal))


def discard(staged: str) -> None:
  """A temporary (file or folder) that will not be committed."""
  if os.path.isdir(staged) and not os.path.islink(staged):
    import shutil  # pylint: disable=g-import-not-at-top
    shutil.rmtree(staged, ignore_errors=True)
  else:
    _remove(staged)


class Appender:
  """A file under model_dir that grows by whole lines (metrics.csv, verify's digests):
  opened once for appending, each write flushed (a crash loses no line the OS was
  given). A bucket gets the file's whole lines with the logs (mirror.push_logs)."""

  def __init__(self, path: str):
    self.path = path
    self._file = None

  @property
  def is_new(self) -> bool:
    return self._file is None and not os.path.exists(self.path)

  def write(self, text: str) -> None:
    if self._file is None:  # opened once, not at every boundary (a tiny model has ~100/s)
      os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
      self._file = open(self.path, "a", newline="", encoding="utf-8")  # pylint: disable=consider-using-with
      record.note(self.path, "appended")
    self._file.write(text)
    self._file.flush()

  def close(self) -> None:
    if self._file is not None:
      file, self._file = self._file, None
      try:
        file.close()
      except OSError:
        pass  # the lines were flushed; a failing close has nothing left to say


_NO_LOCKS = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS)  # a file system that cannot lock


def lock(path: str, refusal: str) -> int | None:
  """An exclusive lock on the file `path` (created if missing), held until `unlock` or
  the process's end (the kernel drops it, SIGKILL included: a stale file means nothing);
  the holder's host, pid and start written in it. A lock another process holds is
  refused: UserError(`refusal`, its "{holder}" filled in with that holder), exit 2.
  Re-checks that the file it locked is still the one at `path` (a holder releasing it
  removes it), so a release racing a lock never yields two holders. On NFS, Linux
  implements flock() with byte-range locks, exclusive across machines; a file system
  that cannot lock gets a warning and None (no lock). Other OSErrors are the caller's."""
  import fcntl  # pylint: disable=g-import-not-at-top  (POSIX only)
  record.note(path, "lock")
  while True:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      os.close(fd)
      raise UserError(refusal.replace("{holder}", _holder(path))) from None
    except OSError as error:
      os.close(fd)
      if error.errno not in _NO_LOCKS:
        raise
      logging.warning("cannot lock %s (%s): make sure only one process writes %s", path,
                      os.strerror(error.errno), os.path.dirname(path))
      return None
    if _same_file(fd, path):  # not removed by a holder releasing it meanwhile
      break
    os.close(fd)
  os.ftruncate(fd, 0)
  os.write(fd, json.dumps({"host": socket.gethostname(), "pid": os.getpid(),
                           "since": time.strftime("%Y-%m-%d %H:%M:%S %z")}).encode())
  return fd


def unlock(fd: int | None, path: str) -> None:
  """Releases `lock`'s lock: the file removed first, then unlocked (a process locking it
  meanwhile finds its file gone and locks a new one)."""
  if fd is None:
    return
  _remove(path)
  os.close(fd)


def _same_file(fd: int, path: str) -> bool:
  try:
    return os.stat(path).st_ino == os.fstat(fd).st_ino
  except FileNotFoundError:
    return False


def _holder(path: str) -> str:
  """'host h, pid 12, since 2025-01-01 10:00:00 +0000' from the lock file."""
  for _ in range(50):  # the holder writes it right after locking: give it a moment
    holder = read_json(path)
    if isinstance(holder, dict) and holder:
      return f"host {holder.get('host')}, pid {holder.get('pid')}, since {holder.get('since')}"
    time.sleep(0.01)
  return f"its host and pid are not in {path} yet"


def held(path: str) -> bool:
  """Whether a process holds the lock on `path` now (a shared probe, released at once;
  False if there is no such file)."""
  import fcntl  # pylint: disable=g-import-not-at-top  (POSIX only)
  try:
    fd = os.open(path, os.O_RDONLY)
  except OSError:
    return False
  try:
    fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    return False
  except BlockingIOError:
    return True
  except OSError:
    return False
  finally:
    os.close(fd)


def _fsync_tree(path: str) -> None:
  paths = [path] if not os.path.isdir(path) else [
      os.path.join(parent, name) for parent, _, names in os.walk(path) for name in names]
  for file in paths:
    fd = os.open(file, os.O_RDONLY)
    try:
      os.fsync(fd)
    finally:
      os.close(fd)


def _remove(path: str) -> None:
  try:
    os.remove(path)
  except OSError:
    pass
