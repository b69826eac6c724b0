"""Object stores as model_dir: `gs://BUCKET/PATH` (Google Cloud Storage) and
`s3://BUCKET/PATH` (Amazon S3 and S3-compatible stores), through each store's own
client library (the `gcs` and `s3` extras: google-cloud-storage, boto3).

A bucket has no rename and no flock, so distloop uses only what every object store
makes atomic: an object is written whole (a reader sees the old object or the new
one, never half), and a write can carry a precondition (GCS `ifGenerationMatch`, S3
`If-None-Match: *` / `If-Match: <etag>`): `create` (only if absent) and `replace`
(only if unchanged since read) are what the writer lease is built on
(trainer/state/lease.py).

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
import datetime
import math
import os
import random
import re
import threading
import time

from trainer.errors import StorageError, UserError

SCHEMES = ("gs", "s3")
_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://([^/]*)/?(.*)$")
_EXTRA = {"gs": "gcs", "s3": "s3"}
_LIBRARY = {"gs": "google-cloud-storage", "s3": "boto3"}
_ATTEMPT_SECONDS = 60.0  # one try's longest wait for an answer (a request that hangs)
_CONNECT_SECONDS = 10.0
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
    made = (_GcsBucket if scheme == "gs" else _S3Bucket)(bucket)
  except ImportError:
    raise UserError(f"{what}={url}: {_LIBRARY[scheme]} is not installed: pip install "
                    f"'distloop[{_EXTRA[scheme]}]'") from None
  except ValueError as e:  # google-cloud-storage checks the bucket's name
    raise UserError(f"{what}={url}: invalid bucket name {bucket!r}: {_first_line(e)}") from None
  return made


class Bucket:
  """The few operations distloop needs; keys are paths inside the bucket."""
  scheme = ""

  def __init__(self, name: str):
    self.name = name
    # The writer lease held on this bucket (trainer/state/lease.py), if any: its
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
      seconds, end = _ATTEMPT_SECONDS, give_up
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
    return _first_line(error)

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


class _GcsBucket(Bucket):
  scheme = "gs"

  def __init__(self, name: str):
    super().__init__(name)
    from google.api_core import exceptions  # pylint: disable=g-import-not-at-top
    from google.cloud import storage  # pylint: disable=g-import-not-at-top
    from google.cloud.storage import retry  # pylint: disable=g-import-not-at-top
    self._exceptions = exceptions
    self._should_retry = retry._should_retry  # pylint: disable=protected-access  (the library's own list)
    project = os.environ.get("GOOGLE_CLOUD_PROJECT") or None
    try:
      self._client = storage.Client(project=project)
    except Exception as e:  # pylint: disable=broad-except  (google.auth: no credentials found)
      raise UserError(f"gs://{name}: no Google Cloud credentials ({_first_line(e)}); run "
                      f"`gcloud auth application-default login`, or set "
                      f"GOOGLE_APPLICATION_CREDENTIALS") from None
    self._bucket = self._client.bucket(name)

  def _transient(self, error):
    return self._should_retry(error)

  def _short(self, error):
    code = getattr(error, "code", None)
    return f"{code} {type(error).__name__}" if code else _first_line(error)

  def _failure(self, error: Exception, key: str, doing: str) -> BucketError:
    code = getattr(error, "code", None)
    reasons = {404: "no such bucket", 403: "access denied (403)", 401: "not authenticated (401)"}
    permanent = code in (400, 401, 403, 404)
    reason = reasons.get(code) or _first_line(error)
    if code == 404 and key:  # an object's 404 is handled by the callers: a bucket's here
      reason = "no such bucket"
    return BucketError(f"cannot {doing} {self.url(key)}: {reason}", permanent=permanent)

  def _call(self, doing: str, key: str, function, *args, write: bool = False, **kwargs):
    """function(*args, **kwargs) with distloop's retries (the library's off) and a
    timeout per try."""
    def attempt(seconds):
      return function(*args, retry=None, timeout=(min(_CONNECT_SECONDS, seconds), seconds),
                      **kwargs)
    try:
      return self._retried(doing, key, attempt, write=write)
    except (self._exceptions.PreconditionFailed, self._exceptions.NotFound, BucketError,
            StorageError):
      raise
    except Exception as e:  # pylint: disable=broad-except  (HTTP, transport, auth)
      raise self._failure(e, key, doing) from None

  def read_versioned(self, key):
    while True:  # the metadata, then the bytes of that generation (a download alone has none)
      blob = self._call("read", key, self._bucket.get_blob, key)
      if blob is None:
        self._bucket_must_exist(key)
        return None
      try:
        data = self._call("read", key, blob.download_as_bytes,
                          if_generation_match=blob.generation)
      except (self._exceptions.NotFound, self._exceptions.PreconditionFailed):
        continue  # replaced or deleted in between
      return data, str(blob.generation), blob.updated.timestamp()

  def _bucket_must_exist(self, key: str) -> None:
    """An object's 404 means no object, unless the bucket itself is missing."""
    try:
      self._call("read", key, self._client.get_bucket, self.name)
    except self._exceptions.NotFound:
      raise BucketError(f"cannot read {self.url(key)}: no such bucket", permanent=True) from None

  def write(self, key, data):
    self._upload(key, data, None)

  def _upload(self, key: str, data: bytes, generation: int | None) -> str:
    blob = self._bucket.blob(key)
    try:
      self._call("write", key, blob.upload_from_string, data, write=True,
                 if_generation_match=generation)
    except self._exceptions.NotFound:
      if generation:  # the object to replace is gone
        raise self._exceptions.PreconditionFailed("deleted") from None
      raise BucketError(f"cannot write {self.url(key)}: no such bucket", permanent=True) from None
    return str(blob.generation)

  def create(self, key, data):
    try:
      return self._upload(key, data, 0)
    except self._exceptions.PreconditionFailed:
      return None

  def replace(self, key, data, version):
    try:
      return self._upload(key, data, int(version))
    except self._exceptions.PreconditionFailed:
      return None

  def delete(self, key, version=None):
    try:
      self._call("delete", key, self._bucket.blob(key).delete, write=True,
                 if_generation_match=int(version) if version else None)
    except (self._exceptions.NotFound, self._exceptions.PreconditionFailed):
      pass

  def list(self, prefix, limit=None):
    def names(**options):
      return [blob.name for blob in self._client.list_blobs(
          self.name, prefix=prefix, max_results=limit, **options)]
    try:
      return self._call("list", prefix, names)
    except self._exceptions.NotFound:
      raise BucketError(f"cannot list {self.url(prefix)}: no such bucket",
                        permanent=True) from None

  def upload(self, key, path):
    try:
      self._call("write", key, self._bucket.blob(key).upload_from_filename, path, write=True)
    except self._exceptions.NotFound:
      raise BucketError(f"cannot write {self.url(key)}: no such bucket", permanent=True) from None

  def download(self, key, path):
    try:
      self._call("read", key, self._bucket.blob(key).download_to_filename, path)
    except self._exceptions.NotFound:
      raise BucketError(f"cannot read {self.url(key)}: it is gone (deleted meanwhile?)",
                        permanent=True) from None


class _S3Bucket(Bucket):
  scheme = "s3"

  def __init__(self, name: str):
    super().__init__(name)
    import boto3  # pylint: disable=g-import-not-at-top
    from boto3.s3 import transfer  # pylint: disable=g-import-not-at-top
    import botocore  # pylint: disable=g-import-not-at-top
    from botocore import config  # pylint: disable=g-import-not-at-top
    self._errors = (botocore.exceptions.ClientError, botocore.exceptions.BotoCoreError)
    self._client_error = botocore.exceptions.ClientError
    self._no_credentials = botocore.exceptions.NoCredentialsError
    self._invalid = botocore.exceptions.ParamValidationError
    self._connection_errors = (botocore.exceptions.ConnectionError,
                               botocore.exceptions.HTTPClientError,
                               botocore.exceptions.IncompleteReadError,
                               botocore.exceptions.ResponseStreamingError)
    self._session, self._config = boto3.session.Session(), config.Config
    self._clients: dict[float, object] = {}
    # As boto3 reads it, once: every client of this bucket talks to one endpoint.
    self._endpoint_url = (os.environ.get("AWS_ENDPOINT_URL_S3")
                          or os.environ.get("AWS_ENDPOINT_URL") or None)
    self._clients_lock = threading.Lock()  # a boto3 session makes one client at a time
    self._client_for(_ATTEMPT_SECONDS)  # made now: a client that cannot be made fails at start
    # One try per request (distloop retries); the whole object again on a retry.
    self._transfer = transfer.TransferConfig(use_threads=False, num_download_attempts=1)

  def _client_for(self, seconds: float):
    """A client whose tries wait up to `seconds` for an answer (botocore sets timeouts per
    client: one per tenth of a second under 2 s, per second above), and that retries
    nothing itself."""
    seconds = min(seconds, _ATTEMPT_SECONDS)
    wait = math.floor(seconds) if seconds >= 2 else max(0.1, math.floor(seconds * 10) / 10)
    with self._clients_lock:
      if wait not in self._clients:
        self._clients[wait] = self._session.client(
            "s3", endpoint_url=self._endpoint_url,
            config=self._config(retries={"mode": "standard", "total_max_attempts": 1},
                                connect_timeout=min(_CONNECT_SECONDS, wait),
                                read_timeout=wait))
      return self._clients[wait]

  def _cause(self, error):
    if isinstance(error, self._errors):
      return error
    last = getattr(error, "last_exception", None)  # s3transfer's RetriesExceededError
    return last or error.__cause__ or error.__context__ or error

  def _status(self, error) -> tuple[str, int | None]:
    response = getattr(error, "response", None) or {}
    return (response.get("Error", {}).get("Code", ""),
            response.get("ResponseMetadata", {}).get("HTTPStatusCode"))

  def _transient(self, error):
    if isinstance(error, self._connection_errors):
      return True
    code, status = self._status(error)
    return (status in (408, 429) or (isinstance(status, int) and status >= 500)
            or code in ("SlowDown", "Throttling", "RequestTimeout", "InternalError",
                        "ServiceUnavailable"))

  def _short(self, error):
    code, status = self._status(error)
    return f"{status} {code}".strip() if code or status else _first_line(error)

  def _failure(self, error: Exception, key: str, doing: str) -> BucketError:
    if isinstance(error, self._no_credentials):
      return BucketError(f"cannot {doing} {self.url(key)}: no AWS credentials found (the "
                         f"AWS credential chain: AWS_ACCESS_KEY_ID, ~/.aws, an instance role)",
                         permanent=True)
    if isinstance(error, self._invalid):  # botocore's reason is on the lines after the first
      reason = " ".join(line.strip() for line in str(error).splitlines() if line.strip())
      reason = re.sub(r":? Bucket name must match .*", "", reason)  # its regex, not a reason
      return BucketError(f"cannot {doing} {self.url(key)}: {reason[:300]}", permanent=True)
    code, status = self._status(error)
    if code == "NoSuchBucket":
      return BucketError(f"cannot {doing} {self.url(key)}: no such bucket", permanent=True)
    if status in (401, 403) or code in ("AccessDenied", "InvalidAccessKeyId",
                                        "SignatureDoesNotMatch"):
      return BucketError(f"cannot {doing} {self.url(key)}: access denied ({code or status})",
                         permanent=True)
    permanent = isinstance(status, int) and 400 <= status < 500 and status != 429
    return BucketError(f"cannot {doing} {self.url(key)}: {code or _first_line(error)}",
                       permanent=permanent)

  def _code(self, error) -> str:
    return self._status(error)[0]

  def _call(self, doing: str, key: str, function, *, write: bool = False):
    """function(a client) with distloop's retries (the client's off) and a timeout per
    try."""
    try:
      return self._retried(doing, key, lambda seconds: function(self._client_for(seconds)),
                           write=write)
    except (BucketError, StorageError):
      raise
    except Exception as e:  # pylint: disable=broad-except  (botocore; boto3.s3.transfer wraps it)
      cause = self._cause(e)
      if self._code(cause) in ("PreconditionFailed", "NoSuchKey", "404",
                               "ConditionalRequestConflict"):
        raise cause from None
      raise self._failure(cause, key, doing) from None

  def read_versioned(self, key):
    def get(client):
      response = client.get_object(Bucket=self.name, Key=key)
      return response, response["Body"].read()  # in the try: a body cut short is retried
    try:
      response, data = self._call("read", key, get)
    except self._client_error as e:
      if self._code(e) in ("NoSuchKey", "404"):
        return None
      raise
    modified = response["LastModified"]
    return data, response["ETag"], (modified.timestamp()
                                    if isinstance(modified, datetime.datetime) else 0.0)

  def write(self, key, data):
    self._call("write", key, lambda client: client.put_object(
        Bucket=self.name, Key=key, Body=data), write=True)

  def _put_if(self, key: str, data: bytes, **condition) -> str | None:
    try:
      response = self._call("write", key, lambda client: client.put_object(
          Bucket=self.name, Key=key, Body=data, **condition), write=True)
    except self._client_error as e:
      # NoSuchKey: If-Match on an object deleted meanwhile (it is at no version)
      if self._code(e) in ("PreconditionFailed", "ConditionalRequestConflict", "NoSuchKey",
                           "404"):
        return None
      raise
    return response["ETag"]

  def create(self, key, data):
    return self._put_if(key, data, IfNoneMatch="*")

  def replace(self, key, data, version):
    return self._put_if(key, data, IfMatch=version)

  def delete(self, key, version=None):
    condition = {"IfMatch": version} if version else {}
    try:
      self._call("delete", key, lambda client: client.delete_object(
          Bucket=self.name, Key=key, **condition), write=True)
    except self._client_error:
      pass  # gone, or no longer ours

  def list(self, prefix, limit=None):
    keys, token = [], None
    while True:
      arguments = {"Bucket": self.name, "Prefix": prefix}
      if limit:
        arguments["MaxKeys"] = limit
      if token:
        arguments["ContinuationToken"] = token
      response = self._call("list", prefix,
                            lambda client, arguments=arguments: client.list_objects_v2(**arguments))
      keys += [entry["Key"] for entry in response.get("Contents", [])]
      token = response.get("NextContinuationToken")
      if not token or (limit and len(keys) >= limit):
        return keys

  def upload(self, key, path):
    self._call("write", key, lambda client: client.upload_file(
        path, self.name, key, Config=self._transfer), write=True)

  def download(self, key, path):
    try:
      self._call("read", key, lambda client: client.download_file(
          self.name, key, path, Config=self._transfer))
    except self._client_error as e:  # 404: gone meanwhile
      raise self._failure(e, key, "read") from None


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


def _first_line(error: BaseException) -> str:
  text = str(error).strip()
  return (text.splitlines()[0] if text else type(error).__name__)[:300]
