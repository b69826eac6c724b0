"""Failed writes to model_dir (and failed checkpoint reads) as one line: what, where,
why, and the space it needed.

A full disk, a read-only file system, a denied permission or an I/O error (a network
file system gone away) reach us in three shapes: an OSError (our own files), a
ValueError whose text names the OS error (orbax reads and writes through tensorstore,
in a background thread) and a TensorFlow OpError (SavedModel). `reason()` recognises
all three; `failure()` turns one into the StorageError the CLI prints as one line
(exit 1). Anything else is a bug, not the disk's fault, and keeps its traceback.
"""
import errno
import os
import re

from trainer.errors import StorageError, UserError

# A full or read-only disk, a denied permission, and the I/O failures of a sick disk
# or a network file system (a server gone, a stale handle, a timeout): the storage's
# fault, never the content's (a read failing so is not a corrupt checkpoint).
_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EFBIG,
           errno.EIO, errno.ESTALE, errno.ENOTCONN, errno.ETIMEDOUT, errno.EHOSTDOWN,
           errno.EHOSTUNREACH, errno.ECONNRESET, errno.ENOLINK, errno.EREMOTEIO)
_REASONS = tuple(os.strerror(code) for code in _ERRNOS)
# What the path itself refuses, for good (a read-only file system, a denied permission,
# a place where no file can be made: /proc answers ENOENT, /sys EPERM): found at start-up,
# before anything was written, that is a --model_dir to change, not a failed run. A full
# disk or a sick storage stays a failure (exit 1): the same command works once it is fixed.
_PATH_ERRNOS = (errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOENT, errno.ENOTDIR,
                errno.EISDIR, errno.ELOOP, errno.ENAMETOOLONG, errno.EINVAL)


def reason(error: BaseException) -> str | None:
  """'No space left on device' (or the like) if `error` or one of its causes is a
  storage failure, else None."""
  seen = set()
  while error is not None and id(error) not in seen:
    seen.add(id(error))
    if isinstance(error, OSError) and error.errno in _ERRNOS:
      return os.strerror(error.errno)
    found = reason_in_text(str(error))
    if found:
      return found
    error = error.__cause__ or error.__context__
  return None


def reason_in_text(text: str) -> str | None:
  """The storage failure a message names (tensorstore: `... [os_error_code='28']`)."""
  code = re.search(r"os_error_code='(\d+)'", text)
  if code and int(code.group(1)) in _ERRNOS:
    return os.strerror(int(code.group(1)))
  for known in _REASONS:
    if known in text:
      return known
  return None


def free_bytes(path: str) -> int | None:
  """Space left for us on the file system holding `path` (or its nearest existing parent)."""
  path = os.path.abspath(path)
  while not os.path.exists(path) and os.path.dirname(path) != path:
    path = os.path.dirname(path)
  try:
    stats = os.statvfs(path)
  except OSError:
    return None
  return stats.f_bavail * stats.f_frsize


def failure(what: str, where: str, error: BaseException,
            needed_bytes: int | None = None) -> StorageError:
  """The one line: `cannot write WHAT to WHERE: REASON (needs about X MB; Y MB free there)`."""
  sizes = []
  if needed_bytes:
    sizes.append(f"needs about {_size(needed_bytes)}")
  free = free_bytes(where)
  if free is not None:
    sizes.append(f"{_size(free)} free there")
  detail = f" ({'; '.join(sizes)})" if sizes else ""
  return StorageError(f"cannot write {what} to {where}: {reason(error) or error}{detail}")


def start_up_failure(what: str | None, where: str, error: OSError) -> Exception:
  """A write at start-up, before the run wrote anything, failed with `error`: UserError
  (exit 2) if the path refuses it (_PATH_ERRNOS), one line naming what and where; the
  StorageError of `failure()` (exit 1) for a storage failure; `error` itself otherwise.
  `what` None: creating the directory `where` (--model_dir) failed."""
  if isinstance(error, OSError) and error.errno in _PATH_ERRNOS:
    action = f"create --model_dir={where}" if what is None else f"write {what} to {where}"
    return UserError(f"cannot {action}: {os.strerror(error.errno)}; found at "
                     f"start-up, nothing was written: make it writable, or use another "
                     f"--model_dir")
  if reason(error) is None:
    return error
  return failure(what or "the directory --model_dir", where, error)


def read_failure(what: str, where: str, error: BaseException) -> StorageError:
  """The one line for a read: `cannot read WHAT in WHERE: REASON; nothing was moved ...`."""
  return StorageError(f"cannot read {what} in {where}: {reason(error) or error}; nothing was "
                      f"moved or deleted: make it readable (permissions, the file system) and "
                      f"run again")


def _size(count: int) -> str:
  return f"{count / 1e6:.1f} MB" if count >= 1e5 else f"{count / 1e3:.1f} kB"
