"""runtime.mlflow_uri: the one-line refusals without the client or a server, a signal
never waiting on MLflow, a deleted MLflow run; the tracking server fixture (sqlite
backend, 127.0.0.1) that tests/outputs/test_trackers.py reads a run back from, through
MLflow's REST API (params, each step once across SIGTERM, SIGKILL and a rollback, the
values, the export).

The server is full `mlflow` in an environment of its own (DISTLOOP_MLFLOW_SERVER: its
`mlflow` executable; .ci/run makes one): distloop needs only the mlflow-skinny client.
"""
import contextlib
import importlib.util
import json
import os
import socket
import subprocess
import time
import urllib.parse
import urllib.request

import pytest

from tests.support.cli import run_trainer

_CLIENT = importlib.util.find_spec("mlflow") is not None
_SERVER = os.environ.get("DISTLOOP_MLFLOW_SERVER", "")
_FLAGS = ["--config=synthetic", "--mode=train_and_eval", "--config.train.steps=20",
          "--config.train.steps_per_loop=10", "--config.eval.interval=10",
          "--config.data.num_train_examples=512", "--config.data.num_eval_examples=200"]


@pytest.mark.skipif(_CLIENT, reason="the MLflow client is installed: this checks its absence")
def test_asking_for_mlflow_without_the_client_is_one_line(tmp_path):
  result = run_trainer(tmp_path / "run", *_FLAGS, "--config.runtime.mlflow_uri=http://127.0.0.1:9")
  assert result.returncode == 2, result.stderr[-3000:]
  (line,) = result.error_lines()
  assert "needs the MLflow client: pip install -e '.[mlflow]'" in line, line
  assert not (tmp_path / "run").exists()


@pytest.mark.skipif(not _CLIENT, reason="the MLflow client is not installed (pip install -e "
                    "'.[mlflow]'; .ci/run installs it for the slow tests)")
def test_a_server_that_cannot_be_reached_is_one_line_and_leaves_nothing(tmp_path):
  result = run_trainer(tmp_path / "run", *_FLAGS,
                       f"--config.runtime.mlflow_uri=http://127.0.0.1:{_free_port()}")
  assert result.returncode == 2, result.stderr[-3000:]
  (line,) = result.error_lines()
  assert "cannot log to MLflow" in line, line
  assert not (tmp_path / "run").exists()


@pytest.fixture(name="server")
def fixture_server(tmp_path):
  """A tracking server on 127.0.0.1 (sqlite, artifacts proxied), its base URL."""
  with tracking_server(tmp_path) as url:
    yield url


@contextlib.contextmanager
def tracking_server(tmp_path):
  if not _CLIENT or not _SERVER:
    pytest.skip("needs the MLflow client (pip install -e '.[mlflow]') and a server: "
                "DISTLOOP_MLFLOW_SERVER=<a full mlflow install>/bin/mlflow (.ci/run sets both)")
  port = _free_port()
  process = subprocess.Popen(
      [_SERVER, "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
       "--backend-store-uri", f"sqlite:///{tmp_path}/mlflow.db",
       "--artifacts-destination", str(tmp_path / "artifacts")],
      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  url = f"http://127.0.0.1:{port}"
  try:
    deadline = time.monotonic() + 180
    while True:
      try:
        with urllib.request.urlopen(f"{url}/health", timeout=5) as response:
          if response.status == 200:
            break
      except OSError:
        pass
      assert process.poll() is None and time.monotonic() < deadline, "the server did not start"
      time.sleep(1)
    yield url
  finally:
    process.terminate()
    process.wait(timeout=60)


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _rest(url: str, endpoint: str, body: dict | None = None, **query) -> dict:
  address = f"{url}/api/2.0/mlflow/{endpoint}"
  if query:
    address += "?" + urllib.parse.urlencode(query)
  data = None if body is None else json.dumps(body).encode()
  request = urllib.request.Request(address, data=data,
                                   headers={"Content-Type": "application/json"})
  with urllib.request.urlopen(request, timeout=30) as response:
    return json.loads(response.read() or b"{}")


def test_a_signal_never_waits_on_an_mlflow_call(tmp_path):
  """A tracking server that stops answering (SIGSTOPped) held a preempted run for the
  client's 20 s timeout per call (20-39 s from SIGTERM to exit 42, past Kubernetes' 30 s
  grace): a call in flight when the signal arrives is left, logging stops, the exit
  goes on (trainer/reporters/fan_out.py bounds every tracker's call). A fake client
  stands for the silent server (no MLflow needed)."""
  import signal  # pylint: disable=import-outside-toplevel
  import threading  # pylint: disable=import-outside-toplevel
  import ml_collections  # pylint: disable=import-outside-toplevel
  from trainer.cluster import preemption  # pylint: disable=import-outside-toplevel
  from trainer.reporters import fan_out  # pylint: disable=import-outside-toplevel
  from trainer.reporters import mlflow_log  # pylint: disable=import-outside-toplevel

  released = threading.Event()

  class SilentServer:
    def set_terminated(self, run_id, status):
      del run_id, status
      released.wait(15)  # what a stopped server's socket does, up to the client's timeout

  log = mlflow_log.MlflowLog(ml_collections.ConfigDict(
      {"mlflow_uri": "http://127.0.0.1:9", "mlflow_experiment": "distloop"}), str(tmp_path))
  log._client, log._run_id = SilentServer(), "run"  # pylint: disable=protected-access
  reporters = fan_out.Reporters([("mlflow", log)], str(tmp_path), enabled=True)
  assert preemption.install()
  timer = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGTERM))
  try:
    timer.start()
    start = time.monotonic()
    reporters.finish({}, None)
    waited = time.monotonic() - start
  finally:
    timer.cancel()
    released.set()
    preemption.uninstall()
    preemption.clear()
  assert waited < 3, f"waited {waited:.1f} s on the MLflow call after the signal"
  assert reporters.labels == []  # logging stopped


@pytest.mark.slow
@pytest.mark.skipif(not _CLIENT, reason="the MLflow client is not installed")
def test_a_file_store_is_refused_in_one_line_naming_sqlite(tmp_path):
  """The docs used to show file:DIR, which the current client refuses (the file store is
  in maintenance mode): exit 2 with MLflow's paragraph cut at its first line."""
  result = run_trainer(tmp_path / "run", *_FLAGS,
                       f"--config.runtime.mlflow_uri=file:{tmp_path}/mlruns",
                       env={"MLFLOW_ALLOW_FILE_STORE": "false"})
  assert result.returncode == 2, result.stderr[-3000:]
  (line,) = result.error_lines()
  assert "file store is in maintenance mode" in line and "sqlite:///" in line, line
  assert not (tmp_path / "run").exists()


@pytest.mark.slow
@pytest.mark.skipif(not _CLIENT, reason="the MLflow client is not installed")
def test_a_deleted_mlflow_run_is_logged_on_in_a_new_run(tmp_path, monkeypatch):
  """mlflow_run.json naming a deleted MLflow run made every resume exit 2 with no hint:
  the resume now logs on into a new run and says so (the file store, allowed here,
  stands for a server)."""
  from mlflow import MlflowClient  # pylint: disable=import-outside-toplevel
  uri, env = f"file:{tmp_path}/mlruns", {"MLFLOW_ALLOW_FILE_STORE": "true"}
  model_dir = tmp_path / "run"
  flags = ["--config=synthetic", "--config.data.num_train_examples=64",
           f"--config.runtime.mlflow_uri={uri}"]
  result = run_trainer(model_dir, *flags, "--config.train.steps=2", env=env)
  assert result.returncode == 0, result.stderr[-3000:]
  first = json.loads((model_dir / "mlflow_run.json").read_text())["run_id"]
  with monkeypatch.context() as patch:
    patch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    MlflowClient(tracking_uri=uri).delete_run(first)
  result = run_trainer(model_dir, *flags, "--config.train.steps=4", env=env)
  assert result.returncode == 0, result.stderr[-3000:]
  second = json.loads((model_dir / "mlflow_run.json").read_text())["run_id"]
  assert second != first
  assert f"MLflow: run {first} of this model_dir" in result.stderr
  assert "was deleted" in result.stderr and "logging into a new run" in result.stderr
