"""Amazon S3 (and S3-compatible stores) as a bucket model_dir (trainer/store/object_stores.py
says what a `Bucket` does and how its requests are retried): boto3, the `s3` extra,
botocore's retries off (one attempt), preconditions by ETag (`If-None-Match: *`,
`If-Match`)."""
import datetime
import math
import os
import re
import threading

from trainer.errors import StorageError
from trainer.store.object_stores import (ATTEMPT_SECONDS, CONNECT_SECONDS, Bucket, BucketError,
                                   first_line)


class S3Bucket(Bucket):
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
    self._client_for(ATTEMPT_SECONDS)  # made now: a client that cannot be made fails at start
    # One try per request (distloop retries); the whole object again on a retry.
    self._transfer = transfer.TransferConfig(use_threads=False, num_download_attempts=1)

  def _client_for(self, seconds: float):
    """A client whose tries wait up to `seconds` for an answer (botocore sets timeouts per
    client: one per tenth of a second under 2 s, per second above), and that retries
    nothing itself."""
    seconds = min(seconds, ATTEMPT_SECONDS)
    wait = math.floor(seconds) if seconds >= 2 else max(0.1, math.floor(seconds * 10) / 10)
    with self._clients_lock:
      if wait not in self._clients:
        self._clients[wait] = self._session.client(
            "s3", endpoint_url=self._endpoint_url,
            config=self._config(retries={"mode": "standard", "total_max_attempts": 1},
                                connect_timeout=min(CONNECT_SECONDS, wait),
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
    return f"{status} {code}".strip() if code or status else first_line(error)

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
    return BucketError(f"cannot {doing} {self.url(key)}: {code or first_line(error)}",
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
