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

from trainer.errors import StorageError

# A full or read-only disk, a denied permission, and the I/O failures of a sick disk
# or a network file system (a server gone, a stale handle, a timeout): the storage's
# fault, never the content's (a read failing so is not a corrupt checkpoint).
_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EFBIG,
           errno.EIO, errno.ESTALE, errno.ENOTCONN, errno.ETIMEDOUT, errno.EHOSTDOWN,
           errno.EHOSTUNREACH, errno.ECONNRESET, errno.ENOLINK, errno.EREMOTEIO)
_REASONS = tuple(os.strerror(code) for code in _ERRNOS)


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


def read_failure(what: str, where: str, error: BaseException) -> StorageError:
  """The one line for a read: `cannot read WHAT in WHERE: REASON; nothing was moved ...`."""
  return StorageError(f"cannot read {what} in {where}: {reason(error) or error}; nothing was "
                      f"moved or deleted: make it readable (permissions, the file system) and "
                      f"run again")


def _size(count: int) -> str:
  return f"{count / 1e6:.1f} MB" if count >= 1e5 else f"{count / 1e3:.1f} kB"
