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
`AWS_ENDPOINT_URL` (S3). Transient faults (HTTP 429 and 5xx, a reset connection) are
retried with backoff by the libraries' own retry policies; what is left is a
`BucketError`: one line naming the bucket, the object and the reason, never a
credential.
"""
import datetime
import importlib
import os
import random
import re

from trainer.errors import StorageError, UserError

SCHEMES = ("gs", "s3")
_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://([^/]*)/?(.*)$")
_EXTRA = {"gs": "gcs", "s3": "s3"}
_LIBRARY = {"gs": "google-cloud-storage", "s3": "boto3"}
# How long a transient fault is retried before the run stops (GCS), and how many times a
# request is retried after its first try (S3, botocore's standard retries: about two
# minutes of backoff). The environment variables are for tests only (a store down past
# the retries in seconds).
_RETRY_SECONDS = float(os.environ.get("DISTLOOP_BUCKET_RETRY_SECONDS", "120"))
_RETRIES = int(os.environ.get("DISTLOOP_BUCKET_RETRIES", "12"))


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
  _random_of_their_own()
  return made


# The client libraries' modules that draw from Python's global `random` (a multipart
# upload's boundary, retry jitter, a download's temporary name).
_DRAWING = ("google.cloud.storage._media._upload", "google.api_core.retry.retry_base",
            "google.auth._exponential_backoff", "google.resumable_media._upload",
            "google.resumable_media._helpers", "botocore.retries.standard",
            "botocore.retryhandler", "botocore.utils", "s3transfer", "s3transfer.utils")


def _random_of_their_own() -> None:
  """Keras draws the default seed of each layer's SeedGenerator from Python's global
  `random`, which distloop seeds: a client library drawing from it too (the lease taken
  before the model is built uploads) trained other weights on a bucket than on a disk.
  Each of those modules gets a `random.Random` of its own."""
  own = random.Random()
  for name in _DRAWING:
    try:
      module = importlib.import_module(name)
    except ImportError:
      continue
    if getattr(module, "random", None) is random:
      module.random = own


class Bucket:
  """The few operations distloop needs; keys are paths inside the bucket."""
  scheme = ""

  def __init__(self, name: str):
    self.name = name

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
    # Every write of ours is idempotent (a whole object, or guarded by a precondition),
    # so every one may be retried.
    self._retry = retry.DEFAULT_RETRY.with_timeout(_RETRY_SECONDS)
    project = os.environ.get("GOOGLE_CLOUD_PROJECT") or None
    try:
      self._client = storage.Client(project=project)
    except Exception as e:  # pylint: disable=broad-except  (google.auth: no credentials found)
      raise UserError(f"gs://{name}: no Google Cloud credentials ({_first_line(e)}); run "
                      f"`gcloud auth application-default login`, or set "
                      f"GOOGLE_APPLICATION_CREDENTIALS") from None
    self._bucket = self._client.bucket(name)

  def _failure(self, error: Exception, key: str, doing: str) -> BucketError:
    code = getattr(error, "code", None)
    reasons = {404: "no such bucket", 403: "access denied (403)", 401: "not authenticated (401)"}
    permanent = code in (400, 401, 403, 404)
    reason = reasons.get(code) or _first_line(error)
    if isinstance(error, self._exceptions.RetryError):  # the retries' time is up
      unreachable = _unreachable(error.cause)
      reason = (f"{'no answer' if unreachable else 'still failing'} after {_RETRY_SECONDS:g} "
                f"s of retries ({unreachable or _first_line(error.cause or error)})")
    if code == 404 and key:  # an object's 404 is handled by the callers: a bucket's here
      reason = "no such bucket"
    return BucketError(f"cannot {doing} {self.url(key)}: {reason}", permanent=permanent)

  def _call(self, doing: str, key: str, function, *args, **kwargs):
    try:
      return function(*args, **kwargs)
    except self._exceptions.PreconditionFailed:
      raise
    except self._exceptions.NotFound:
      raise
    except Exception as e:  # pylint: disable=broad-except  (HTTP, transport, auth)
      raise self._failure(e, key, doing) from None

  def read_versioned(self, key):
    while True:  # the metadata, then the bytes of that generation (a download alone has none)
      blob = self._call("read", key, self._bucket.get_blob, key, retry=self._retry)
      if blob is None:
        self._bucket_must_exist(key)
        return None
      try:
        data = self._call("read", key, blob.download_as_bytes, retry=self._retry,
                          if_generation_match=blob.generation)
      except (self._exceptions.NotFound, self._exceptions.PreconditionFailed):
        continue  # replaced or deleted in between
      return data, str(blob.generation), blob.updated.timestamp()

  def _bucket_must_exist(self, key: str) -> None:
    """An object's 404 means no object, unless the bucket itself is missing."""
    try:
      self._call("read", key, self._client.get_bucket, self.name, retry=self._retry)
    except self._exceptions.NotFound:
      raise BucketError(f"cannot read {self.url(key)}: no such bucket", permanent=True) from None

  def write(self, key, data):
    self._upload(key, data, None)

  def _upload(self, key: str, data: bytes, generation: int | None) -> str:
    blob = self._bucket.blob(key)
    try:
      self._call("write", key, blob.upload_from_string, data, retry=self._retry,
                 if_generation_match=generation)
    except self._exceptions.NotFound:
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
      self._call("delete", key, self._bucket.blob(key).delete, retry=self._retry,
                 if_generation_match=int(version) if version else None)
    except (self._exceptions.NotFound, self._exceptions.PreconditionFailed):
      pass

  def list(self, prefix, limit=None):
    try:
      return self._call("list", prefix, lambda: [
          blob.name for blob in self._client.list_blobs(
              self.name, prefix=prefix, max_results=limit, retry=self._retry)])
    except self._exceptions.NotFound:
      raise BucketError(f"cannot list {self.url(prefix)}: no such bucket",
                        permanent=True) from None

  def upload(self, key, path):
    try:
      self._call("write", key, self._bucket.blob(key).upload_from_filename, path,
                 retry=self._retry)
    except self._exceptions.NotFound:
      raise BucketError(f"cannot write {self.url(key)}: no such bucket", permanent=True) from None

  def download(self, key, path):
    try:
      self._call("read", key, self._bucket.blob(key).download_to_filename, path,
                 retry=self._retry)
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
    self._connection_errors = (botocore.exceptions.ConnectionError,
                               botocore.exceptions.HTTPClientError)
    # botocore's standard retries: 429, 5xx and connection errors, with backoff.
    self._client = boto3.client("s3", config=config.Config(
        retries={"mode": "standard", "max_attempts": _RETRIES}, connect_timeout=10,
        read_timeout=60))
    self._transfer = transfer.TransferConfig(use_threads=False)

  def _failure(self, error: Exception, key: str, doing: str) -> BucketError:
    if isinstance(error, self._no_credentials):
      return BucketError(f"cannot {doing} {self.url(key)}: no AWS credentials found (the "
                         f"AWS credential chain: AWS_ACCESS_KEY_ID, ~/.aws, an instance role)",
                         permanent=True)
    response = getattr(error, "response", None) or {}
    code = response.get("Error", {}).get("Code", "")
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    if code == "NoSuchBucket":
      return BucketError(f"cannot {doing} {self.url(key)}: no such bucket", permanent=True)
    if status in (401, 403) or code in ("AccessDenied", "InvalidAccessKeyId",
                                        "SignatureDoesNotMatch"):
      return BucketError(f"cannot {doing} {self.url(key)}: access denied ({code or status})",
                         permanent=True)
    permanent = isinstance(status, int) and 400 <= status < 500 and status != 429
    reason = code or _first_line(error)
    unreachable = (_unreachable(error) or "could not connect"
                   if isinstance(error, self._connection_errors) else None)
    if unreachable or status == 429 or (isinstance(status, int) and status >= 500):
      reason = (f"{'no answer' if unreachable else 'still failing'} after {_RETRIES} "  # spent
                f"retr{'y' if _RETRIES == 1 else 'ies'} ({unreachable or reason})")
    return BucketError(f"cannot {doing} {self.url(key)}: {reason}", permanent=permanent)

  def _code(self, error) -> str:
    return (getattr(error, "response", None) or {}).get("Error", {}).get("Code", "")

  def _call(self, doing: str, key: str, function, **kwargs):
    try:
      return function(**kwargs)
    except self._errors as e:
      if self._code(e) in ("PreconditionFailed", "NoSuchKey", "404", "ConditionalRequestConflict"):
        raise
      raise self._failure(e, key, doing) from None

  def read_versioned(self, key):
    try:
      response = self._call("read", key, self._client.get_object, Bucket=self.name, Key=key)
    except self._client_error as e:
      if self._code(e) in ("NoSuchKey", "404"):
        return None
      raise
    data = response["Body"].read()
    modified = response["LastModified"]
    return data, response["ETag"], (modified.timestamp()
                                    if isinstance(modified, datetime.datetime) else 0.0)

  def write(self, key, data):
    self._call("write", key, self._client.put_object, Bucket=self.name, Key=key, Body=data)

  def _put_if(self, key: str, data: bytes, **condition) -> str | None:
    try:
      response = self._call("write", key, self._client.put_object, Bucket=self.name, Key=key,
                            Body=data, **condition)
    except self._client_error as e:
      if self._code(e) in ("PreconditionFailed", "ConditionalRequestConflict"):
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
      self._call("delete", key, self._client.delete_object, Bucket=self.name, Key=key,
                 **condition)
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
      response = self._call("list", prefix, self._client.list_objects_v2, **arguments)
      keys += [entry["Key"] for entry in response.get("Contents", [])]
      token = response.get("NextContinuationToken")
      if not token or (limit and len(keys) >= limit):
        return keys

  def upload(self, key, path):
    try:
      self._client.upload_file(path, self.name, key, Config=self._transfer)
    except self._errors as e:
      raise self._failure(e, key, "write") from None
    except Exception as e:  # pylint: disable=broad-except  (boto3.s3.transfer wraps them)
      cause = e.__cause__ or e.__context__
      raise self._failure(cause if isinstance(cause, self._errors) else e, key,
                          "write") from None

  def download(self, key, path):
    try:
      self._client.download_file(self.name, key, path, Config=self._transfer)
    except self._errors as e:
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
