"""One writer per bucket model_dir: a lease on the object `<model_dir>/.lock`.

A bucket has no flock, and a process killed with SIGKILL releases nothing: so the
lock is an object created with the store's own precondition (GCS
`ifGenerationMatch=0`, S3 `If-None-Match: *`: of two creates exactly one succeeds),
holding who holds it (host, pid, since, a token of this run), and renewed by its
holder every lease_seconds/4 with a compare-and-swap (`ifGenerationMatch=<ours>`,
`If-Match: <etag>`). A lease not renewed for `checkpoint.lease_seconds` has expired:
its holder is dead or cut off.

A trainer that finds the lease held watches it: renewed meanwhile, the holder is alive
and this one exits 2 naming it; not renewed for lease_seconds (by the store's clock,
or by this process's own watch, whichever comes first), it is taken over with the same
compare-and-swap, and said in one line. Two takeovers racing swap the same version:
one wins, the other then sees a live holder and exits 2. A holder checks its lease
before each checkpoint commit (trainer/store/mirror.py): one whose lease was taken
over, or that could not renew it for lease_seconds, stops writing (exit 1).

The holder's lease could be taken over from its `deadline()` on: the moment it sent its
last successful renewal, plus lease_seconds (the store saw the renewal after it was sent,
so a taker's count starts later). Each of the holder's writes is tried no later than that
(object_stores.Bucket.writer): a holder cut off mid-write, whose store comes back after another
trainer took over, writes nothing more.
"""
import json
import os
import socket
import threading
import time
import uuid

from absl import logging

from trainer.errors import StorageError, UserError
from trainer.store import object_stores
from trainer.store.record import note

LOCK_NAME = ".lock"
_STAMP_SECONDS = 1.0  # the coarsest store clock's step (S3's Last-Modified)


class BucketLease:
  """Held from `acquire()` to `release()`; `created_model_dir`: the bucket held nothing
  under model_dir before (a refused run then leaves nothing)."""

  def __init__(self, mirror, version: str, record: dict, lease_seconds: float,
               renewed: float, folder: str | None = None):
    self.mirror = mirror
    self.folder = folder or mirror.local  # what it is the lease of: model_dir, or a folder in it
    self.key = mirror.key(os.path.join(self.folder, LOCK_NAME))
    self.path = mirror.bucket.url(self.key)
    self.created_model_dir = mirror.created
    self._version = version
    self._record = record
    self._seconds = lease_seconds
    self._renewed = renewed  # time.monotonic() when the write that holds it was sent
    self._lost: str | None = None
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._renew_until_released, daemon=True,
                                    name="distloop: writer lease")
    mirror.lease = self
    mirror.bucket.writer = self
    self._thread.start()

  @classmethod
  def acquire(cls, mirror, lease_seconds: float, *, clock=time.time, sleep=time.sleep,
              folder: str | None = None, refusal: str | None = None) -> "BucketLease":
    """The lease of `mirror`'s model_dir (or of `folder` in it: a predictions' folder);
    UserError (exit 2) naming a live holder (`refusal`, then the holder, if given)."""
    key = mirror.key(os.path.join(folder or mirror.local, LOCK_NAME))
    url = mirror.bucket.url(key)
    token = uuid.uuid4().hex
    record = {"host": socket.gethostname(), "pid": os.getpid(),
              "since": time.strftime("%Y-%m-%d %H:%M:%S %z"), "token": token,
              "lease_seconds": lease_seconds}
    data = json.dumps(record).encode()
    watched = None  # (version, when this process first saw it)
    said_waiting = False
    while True:
      sent = time.monotonic()
      version = mirror.bucket.create(key, data)
      if version is not None:
        note(url, "put", lease=True)
      if version is not None or _ours(mirror.bucket, key, token):
        return cls._held(mirror, version or mirror.bucket.read_versioned(key)[1], record,
                         lease_seconds, sent, restage=watched is not None, folder=folder)
      found = mirror.bucket.read_versioned(key)
      if found is None:
        continue  # released meanwhile: create it again
      raw, version, modified = found
      holder = _parse(raw)
      seconds = float(holder.get("lease_seconds") or lease_seconds)
      if watched is not None and watched[0] != version:  # renewed meanwhile: alive
        alive = f"{_describe(holder)}; it renewed its lease {url} meanwhile"
        raise UserError(f"{refusal} ({alive})" if refusal else
                        f"--model_dir={mirror.url} is in use by another trainer ({alive}): "
                        f"only one may write it: wait for that one to end, or stop it, or "
                        f"use another --model_dir")
      if watched is None:
        watched = (version, time.monotonic())
      # By the store's clock less a second (S3's Last-Modified counts whole seconds: the
      # renewal may be up to 1 s younger), or by this process's watch: never before the
      # holder's deadline (its renewal was sent before the store stamped it).
      idle = max(clock() - modified - _STAMP_SECONDS, time.monotonic() - watched[1])
      if idle >= seconds:
        sent = time.monotonic()
        taken = mirror.bucket.replace(key, data, version)
        if taken is not None:
          note(url, "put", lease=True)
          logging.warning("Took over the writer lease %s of %s: not renewed for %.0f s "
                          "(checkpoint.lease_seconds=%g), the holder is gone", url,
                          _describe(holder), idle, seconds)
          return cls._held(mirror, taken, record, lease_seconds, sent, restage=True,
                           folder=folder)
        watched = (None, time.monotonic())  # another took it first: watch the new holder
        continue
      if not said_waiting:
        logging.info("%s is leased to %s (renewed %.0f s ago): waiting up to "
                     "%.0f s to see whether it is alive (checkpoint.lease_seconds)",
                     url.rsplit("/", 1)[0] if folder else f"--model_dir={mirror.url}",
                     _describe(holder), max(clock() - modified, 0), seconds - idle)
        said_waiting = True
      sleep(min(max(seconds / 8, 0.2), seconds - idle))

  @classmethod
  def _held(cls, mirror, version: str, record: dict, lease_seconds: float, sent: float, *,
            restage: bool, folder: str | None = None) -> "BucketLease":
    """The lease just taken. `restage`: another trainer held it since this run staged the
    bucket (it released it, or died), so what it committed meanwhile is staged now: from
    the earlier copy this run would resume from an older step, and its first commit
    would remove the newer ones from the bucket as steps retention dropped."""
    if restage:
      try:
        if folder:
          mirror.pull_tree(folder)
        else:
          mirror.pull()
      except BaseException:
        try:
          mirror.bucket.delete(mirror.key(os.path.join(folder or mirror.local, LOCK_NAME)),
                               version)
        except object_stores.BucketError:
          pass  # it expires
        raise
    return cls(mirror, version, record, lease_seconds, sent, folder)

  def _renew_until_released(self) -> None:
    interval = max(self._seconds / 4, 0.1)
    while not self._stop.wait(interval):
      try:
        if not self._renew():
          return
      except StorageError as e:  # past the deadline (check() said why), or a store's refusal
        if self._lost is None:
          self._lost = f"it could not be renewed ({e})"
        logging.error("lost the writer lease %s: %s", self.path, self._lost)
        return
      except Exception as e:  # pylint: disable=broad-except  (no traceback from a thread)
        self._lost = f"its renewal failed ({type(e).__name__}: {e})"
        logging.error("lost the writer lease %s: %s", self.path, self._lost)
        return

  def _renew(self) -> bool:
    """One renewal: False once the lease is found another's, or deleted, or past its
    deadline (no write then: it may be another's)."""
    if self._lost is None and time.monotonic() >= self.deadline():
      self._lost = self._why_lost()
      logging.error("lost the writer lease %s: %s", self.path, self._lost)
      return False
    record = {**self._record, "renewed": time.strftime("%Y-%m-%d %H:%M:%S %z")}
    sent = time.monotonic()
    try:
      version = self.mirror.bucket.replace(self.key, json.dumps(record).encode(),
                                           self._version)
    except object_stores.BucketError as e:
      if e.permanent:
        raise
      logging.warning("could not renew the writer lease %s (%s): trying again", self.path, e)
      return True
    if version is None and not _ours(self.mirror.bucket, self.key, self._record["token"]):
      self._lost = self._why_lost()
      logging.error("lost the writer lease %s: %s", self.path, self._lost)
      return False
    self._version = version or self.mirror.bucket.read_versioned(self.key)[1]
    self._renewed = sent
    return True

  def _why_lost(self) -> str:
    """What the lease object says of a lease this process may no longer hold (a read)."""
    try:
      found = self.mirror.bucket.read_versioned(self.key)
    except object_stores.BucketError:
      return self._not_renewed()
    if found is None:
      return "it was deleted (by hand, or by a trainer that took it over and ended)"
    holder = _parse(found[0])
    if holder.get("token") != self._record["token"]:
      return f"another trainer took it over ({_describe(holder)})"
    return self._not_renewed()

  def _not_renewed(self) -> str:
    return (f"it could not be renewed for {self._seconds:g} s (checkpoint.lease_seconds), "
            f"so another trainer may take it over")

  def deadline(self) -> float:
    """time.monotonic() from which another trainer may hold the lease."""
    return self._renewed + self._seconds

  def check(self) -> None:
    """StorageError unless this process still holds the lease: before each commit, and
    before each try of each write (object_stores.Bucket.writer)."""
    if self._lost is None and time.monotonic() >= self.deadline():
      self._lost = self._not_renewed()
    if self._lost is not None:
      raise StorageError(f"lost the writer lease {self.path}: {self._lost}; this run writes "
                         f"no more to {self.mirror.url}")

  def release(self, *, refused: bool = False) -> None:
    """Puts the last logs in the bucket and deletes the lease (if still ours). `refused`:
    a run of bad input on a path that held nothing leaves nothing there."""
    self._stop.set()
    self._thread.join()
    try:
      self.check()  # lost (taken over, or not renewed for lease_seconds): the logs are not ours
    except StorageError:
      self._let_go()
      return
    try:
      if self.folder != self.mirror.local:
        pass  # a folder's lease: what it leased was put in the bucket as it was written
      elif refused and self.created_model_dir:
        self.mirror.remove_everything()
      else:
        self.mirror.push_logs()
    finally:
      try:
        self.mirror.bucket.delete(self.key, self._version)
      finally:
        self._let_go()

  def _let_go(self) -> None:
    self.mirror.lease = None
    self.mirror.bucket.writer = None


def _ours(bucket, key: str, token: str) -> bool:
  """Whether the lease object holds `token` (a write of ours whose reply was lost, then
  retried against its own new version, looks like a refusal)."""
  found = bucket.read_versioned(key)
  return found is not None and _parse(found[0]).get("token") == token


def _parse(raw: bytes) -> dict:
  try:
    record = json.loads(raw.decode("utf-8"))
  except ValueError:
    return {}
  return record if isinstance(record, dict) else {}


def _describe(holder: dict) -> str:
  if not holder.get("host"):
    return "a holder that wrote no host and pid"
  return f"host {holder['host']}, pid {holder.get('pid')}, since {holder.get('since')}"
