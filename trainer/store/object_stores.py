"""Object stores as model_dir: `gs://BUCKET/PATH` (Google Cloud Storage) and
`s3://BUCKET/PATH` (Amazon S3 and S3-compatible stores), through each store's own
client library (the `gcs` and `s3` extras: google-cloud-storage, boto3).

A bucket has no rename and no flock, so distloop uses only what every object store
makes atomic: an object is written whole (a reader sees the old object or the new
one, never half), and a write can carry a precondition (GCS `ifGenerationMatch`, S3
`If-None-Match: *` / `If-Match: <etag>`): `create` (only if absent) and `replace`
(only if unchanged since read) are what the writer lease is built on
(trainer/store/lease.py).

Configuration is the client libraries' own, nothing of distloop's: application-default
credentials and `STORAGE_EMULATOR_HOST` (GCS), the AWS credential chain and
`AWS_ENDPOINT_URL` (S3).

Retries are distloop's, the same on both stores (the libraries' own are off): a
transient fault (HTTP 408, 429, 5xx, a refused or reset connection, a timeout) is
retried with backoff until `retry_seconds()` have passed since the request's first try,
and a lease holder's write no later than its lease could be taken over (`writer`): a
holder cut off for longer writes nothing once another trainer may hold model_dir. The
backoff's jitter comes from a generator of this module's own: a retry draws nothing
from Python's global `random`. What is left is a `BucketError`: one line naming the
bucket, the object and the reason, never a credential.
"""
import os
import random
import re
import time

from trainer.errors import StorageError, UserError

SCHEMES = ("gs", "s3")
_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://([^/]*)/?(.*)$")
_EXTRA = {"gs": "gcs", "s3": "s3"}
_LIBRARY = {"gs": "google-cloud-storage", "s3": "boto3"}
ATTEMPT_SECONDS = 60.0  # one try's longest wait for an answer (a request that hangs)
CONNECT_SECONDS = 10.0
_FIRST_BACKOFF, _LONGEST_BACKOFF = 0.1, 5.0  # seconds, doubling: a store back is seen in 5 s
_JITTER = random.Random()  # never the global generator, which Keras seeds from (runtime.seed)


def retry_seconds() -> float:
  """How long a transient fault is retried before the request fails: 120 s (an outage
  that long is ridden out). DISTLOOP_BUCKET_RETRY_SECONDS is for tests (a store down
  past the retries in seconds)."""
  return float(os.environ.get("DISTLOOP_BUCKET_RETRY_SECONDS", "120"))


class BucketError(StorageError):
  """A request the store refused for good, or kept failing past its retries: exit 1
  during a run; at start-up a missing bucket or a denied credential is bad input."""

  def __init__(self, message: str, *, permanent: bool):
    super().__init__(message)
    self.permanent = permanent


def is_url(path) -> bool:
  return bool(_URL.match(str(path)))


def parse(url: str, what: str = "--model_dir") -> tuple[str, str, str]:
  """(scheme, bucket, path inside the bucket without slashes at its ends); UserError for
  a scheme distloop cannot write, or no bucket name."""
  match = _URL.match(str(url))
  if not match:
    raise UserError(f"{what}={url} is not a URL")
  scheme, bucket, path = match.group(1).lower(), match.group(2), match.group(3).strip("/")
  if scheme not in SCHEMES:
    raise UserError(f"{what}={url}: {scheme}:// is not supported (distloop writes a model_dir "
                    f"on a local or network file system, gs:// or s3://); mount that storage "
                    f"with a FUSE driver and give the mount path, or copy to gs:// or s3://")
  if not bucket:
    raise UserError(f"{what}={url} names no bucket: {scheme}://BUCKET/PATH")
  return scheme, bucket, path


def open_bucket(url: str, what: str = "--model_dir") -> "Bucket":
  """The bucket of `url`, its client made (UserError if the extra is not installed)."""
  scheme, bucket, _ = parse(url, what)
  try:
    if scheme == "gs":
      from trainer.store import gcs_bucket  # pylint: disable=g-import-not-at-top  (the extra's)
      made = gcs_bucket.GcsBucket(bucket)
    else:
      from trainer.store import s3_bucket  # pylint: disable=g-import-not-at-top  (the extra's)
      made = s3_bucket.S3Bucket(bucket)
  except ImportError:
    raise UserError(f"{what}={url}: {_LIBRARY[scheme]} is not installed: pip install "
                    f"'distloop[{_EXTRA[scheme]}]'") from None
  except ValueError as e:  # google-cloud-storage checks the bucket's name
    raise UserError(f"{what}={url}: invalid bucket name {bucket!r}: {first_line(e)}") from None
  return made


class Bucket:
  """The few operations distloop needs; keys are paths inside the bucket."""
  scheme = ""

  def __init__(self, name: str):
    self.name = name
    # The writer lease held on this bucket (trainer/store/lease.py), if any: its
    # `deadline()` (time.monotonic) bounds each write's tries, its `check()` raises past it.
    self.writer = None

  def _retried(self, doing: str, key: str, attempt, *, write: bool):
    """attempt(seconds it may wait for an answer), tried again on a transient fault (the
    store's `_transient`) with backoff, until retry_seconds() have passed, or, for a write
    of a lease holder, until its lease could be taken over: StorageError then, naming the
    lease. Other errors go to the caller as they are."""
    give_up = time.monotonic() + retry_seconds()
    backoff = _FIRST_BACKOFF
    while True:
      seconds, end = ATTEMPT_SECONDS, give_up
      writer = self.writer if write else None
      if writer is not None:
        lease_end = writer.deadline()
        if time.monotonic() >= lease_end:
          writer.check()  # raises: the lease may be another's now
        seconds = min(seconds, lease_end - time.monotonic())
        end = min(end, lease_end)
      try:
        return attempt(max(seconds, 0.01))
      except Exception as e:  # pylint: disable=broad-except  (the store's own types)
        if not self._transient(self._cause(e)):
          raise
        error = self._cause(e)
      now = time.monotonic()
      if now >= give_up:
        raise self._gave_up(error, key, doing)
      if now < end:
        time.sleep(min(_JITTER.uniform(backoff / 2, backoff), end - now))
      backoff = min(backoff * 2, _LONGEST_BACKOFF)

  def _transient(self, error: Exception) -> bool:
    raise NotImplementedError

  def _cause(self, error: Exception) -> Exception:
    """The library's error inside a wrapper of its own (boto3's transfers wrap theirs)."""
    return error

  def _gave_up(self, error: Exception, key: str, doing: str) -> "BucketError":
    """The line for a transient fault that outlasted retry_seconds()."""
    unreachable = _unreachable(error)
    reason = unreachable or self._short(error)
    return BucketError(f"cannot {doing} {self.url(key)}: "
                       f"{'no answer' if unreachable else 'still failing'} after "
                       f"{retry_seconds():g} s of retries ({reason})", permanent=False)

  def _short(self, error: Exception) -> str:
    return first_line(error)

  def url(self, key: str = "") -> str:
    return f"{self.scheme}://{self.name}/{key}" if key else f"{self.scheme}://{self.name}"

  def check(self, what: str) -> None:
    """UserError (exit 2) unless the bucket exists and this credential may read it."""
    try:
      self.list("", limit=1)
    except BucketError as e:
      if e.permanent:
        raise UserError(f"{what}: {e}; found at start-up, nothing was written") from None
      raise

  # Each store implements these.
  def read(self, key: str) -> bytes | None:
    """The object's bytes, or None where there is none."""
    found = self.read_versioned(key)
    return None if found is None else found[0]

  def read_versioned(self, key: str) -> tuple[bytes, str, float] | None:
    """(bytes, version, last modified as a UNIX time by the store's clock), or None."""
    raise NotImplementedError

  def write(self, key: str, data: bytes) -> None:
    raise NotImplementedError

  def create(self, key: str, data: bytes) -> str | None:
    """Writes `key` only if it does not exist: its version, or None if it exists."""
    raise NotImplementedError

  def replace(self, key: str, data: bytes, version: str) -> str | None:
    """Writes `key` only if it is still at `version`: the new version, or None."""
    raise NotImplementedError

  def delete(self, key: str, version: str | None = None) -> None:
    """Removes `key` (if still at `version`, when given); no error if it is gone."""
    raise NotImplementedError

  def list(self, prefix: str, limit: int | None = None) -> list[str]:
    """The keys under `prefix` (every depth)."""
    raise NotImplementedError

  def upload(self, key: str, path: str) -> None:
    raise NotImplementedError

  def download(self, key: str, path: str) -> None:
    raise NotImplementedError


def _unreachable(error: BaseException | None) -> str | None:
  """Why a connection failed, in a few words ('Connection refused'), or None if it did
  not: the libraries' own text holds a connection pool's repr and the whole URL."""
  text = str(error or "")
  found = re.search(r"\[Errno -?\d+\] ([^'\")\]]+)", text)
  if found:
    return found.group(1).strip()
  if "Could not connect to the endpoint URL" in text:  # botocore's EndpointConnectionError
    return "could not connect"
  if "Connection aborted" in text or "Connection reset" in text:
    return "connection reset"
  if "timed out" in text:
    return "timed out"
  return None


def first_line(error: BaseException) -> str:
  text = str(error).strip()
  return (text.splitlines()[0] if text else type(error).__name__)[:300]
