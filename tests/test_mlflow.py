"""runtime.mlflow_uri against a real MLflow tracking server (sqlite backend, 127.0.0.1),
read back through its REST API; and the one-line refusals without the client or a server.

The server is full `mlflow` in an environment of its own (DISTLOOP_MLFLOW_SERVER: its
`mlflow` executable; .ci/run makes one): distloop needs only the mlflow-skinny client.
"""
import csv
import importlib.util
import json
import os
import socket
import subprocess
import time
import urllib.parse
import urllib.request

import pytest

from tests.cli import run_trainer, train_ok

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


@pytest.mark.slow
def test_params_metrics_and_the_export_reach_the_server_and_a_resume_logs_on(server, tmp_path):
  """Catches: params or metrics not sent (or under other names or steps), values that
  differ from what distloop reports, the export not uploaded, a resume opening a second
  MLflow run (or re-sending params, which MLflow refuses)."""
  model_dir = tmp_path / "run"
  train_ok(model_dir, *_FLAGS, f"--config.runtime.mlflow_uri={server}")
  experiment = _rest(server, "experiments/get-by-name", experiment_name="distloop")
  experiment_id = experiment["experiment"]["experiment_id"]
  (run,) = _rest(server, "runs/search", {"experiment_ids": [experiment_id]})["runs"]
  run_id = run["info"]["run_id"]
  assert run["info"]["status"] == "FINISHED"
  params = {p["key"]: p["value"] for p in run["data"]["params"]}
  assert params["train.steps"] == "20" and params["model.name"] == "mnist_cnn"

  def history(key):
    return {m["step"]: m["value"] for m in
            _rest(server, "metrics/get-history", run_id=run_id, metric_key=key)["metrics"]}

  with open(model_dir / "metrics.csv", newline="") as f:
    logged = {(int(r["step"]), r["split"], r["name"]): float(r["value"]) for r in csv.DictReader(f)}
  for key in ("train/loss", "train/accuracy", "eval/loss", "eval/accuracy"):
    split, name = key.split("/")
    values = history(key)
    assert sorted(values) == [10, 20], (key, values)
    for step, value in values.items():
      assert value == pytest.approx(logged[step, split, name], rel=1e-6), key
  files = {os.path.basename(f["path"]) for f in
           _rest(server, "artifacts/list", run_id=run_id, path="export/20").get("files", [])}
  assert "saved_model.pb" in files, files

  train_ok(model_dir, *_FLAGS, "--config.train.steps=30", f"--config.runtime.mlflow_uri={server}")
  runs = _rest(server, "runs/search", {"experiment_ids": [experiment_id]})["runs"]
  assert [r["info"]["run_id"] for r in runs] == [run_id]
  assert sorted(history("train/loss")) == [10, 20, 30]
