"""Google Cloud Storage as a bucket model_dir (trainer/store/object_stores.py says what a
`Bucket` does and how its requests are retried): google-cloud-storage, the `gcs` extra,
its own retries off (`retry=None`), preconditions by generation (`ifGenerationMatch`)."""
import os

from trainer.errors import StorageError, UserError
from trainer.store.object_stores import (CONNECT_SECONDS, Bucket, BucketError,
                                   first_line)


class GcsBucket(Bucket):
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
      raise UserError(f"gs://{name}: no Google Cloud credentials ({first_line(e)}); run "
                      f"`gcloud auth application-default login`, or set "
                      f"GOOGLE_APPLICATION_CREDENTIALS") from None
    self._bucket = self._client.bucket(name)

  def _transient(self, error):
    return self._should_retry(error)

  def _short(self, error):
    code = getattr(error, "code", None)
    return f"{code} {type(error).__name__}" if code else first_line(error)

  def _failure(self, error: Exception, key: str, doing: str) -> BucketError:
    code = getattr(error, "code", None)
    reasons = {404: "no such bucket", 403: "access denied (403)", 401: "not authenticated (401)"}
    permanent = code in (400, 401, 403, 404)
    reason = reasons.get(code) or first_line(error)
    if code == 404 and key:  # an object's 404 is handled by the callers: a bucket's here
      reason = "no such bucket"
    return BucketError(f"cannot {doing} {self.url(key)}: {reason}", permanent=permanent)

  def _call(self, doing: str, key: str, function, *args, write: bool = False, **kwargs):
    """function(*args, **kwargs) with distloop's retries (the library's off) and a
    timeout per try."""
    def attempt(seconds):
      return function(*args, retry=None, timeout=(min(CONNECT_SECONDS, seconds), seconds),
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
