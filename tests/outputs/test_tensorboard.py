"""What TensorBoard shows of a finished run, read over the HTTP API of a real
`tensorboard` server on 127.0.0.1: the scalar tags, a falling loss, the schedule's
learning rate, hparams, the config, sample inputs, the step graph; and the profile
window's trace file."""
import glob
import json
import socket
import subprocess
import time
import urllib.request

import pytest

from tests.support.cli import train_ok
from tests.support.profiles import step_markers

_STEPS = 200


@pytest.fixture(scope="module")
def tensorboard(tmp_path_factory):
  """(model_dir, get(path) -> JSON, post(path, body) -> JSON) against a live server."""
  model_dir = tmp_path_factory.mktemp("run")
  train_ok(model_dir, "--config=synthetic", "--mode=train_and_eval",
           f"--config.train.steps={_STEPS}", "--config.train.steps_per_loop=25",
           "--config.eval.interval=50", "--config.train.lr_schedule=cosine",
           "--config.train.warmup_steps=50", "--config.train.clip_grad_norm=5.0",
           "--config.train.report_gradient_norm=true",
           "--config.runtime.profile_steps=100,125")
  with socket.socket() as probe:
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
  server = subprocess.Popen(
      ["tensorboard", f"--logdir={model_dir}/tensorboard", "--host=127.0.0.1", f"--port={port}",
       "--load_fast=false"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  base = f"http://127.0.0.1:{port}"

  def request(path, body=None):
    headers = {"X-XSRF-Protected": "1", "Content-Type": "application/json"}
    data = json.dumps(body).encode() if body is not None else None
    with urllib.request.urlopen(urllib.request.Request(base + path, data=data, headers=headers),
                                timeout=30) as response:
      return json.loads(response.read())

  try:
    deadline = time.monotonic() + 90
    while True:
      try:
        if set(request("/data/runs")) >= {"train", "eval"}:
          break
      except OSError:
        pass
      assert server.poll() is None and time.monotonic() < deadline, "tensorboard did not start"
      time.sleep(0.5)
    yield model_dir, request
  finally:
    server.kill()
    server.wait()


def test_train_and_eval_scalars_are_served(tensorboard):
  _, request = tensorboard
  tags = request("/data/plugin/scalars/tags")
  assert set(tags["train"]) >= {"loss", "accuracy", "learning_rate", "examples_per_sec",
                                "steps_per_sec", "gradient_norm"}
  assert set(tags["eval"]) >= {"loss", "accuracy"}
  eval_steps = [step for _, step, _ in
                request("/data/plugin/scalars/scalars?run=eval&tag=accuracy")]
  assert eval_steps == [50, 100, 150, 200]


def test_loss_falls_and_the_learning_rate_follows_its_schedule(tensorboard):
  _, request = tensorboard
  loss = [value for _, _, value in request("/data/plugin/scalars/scalars?run=train&tag=loss")]
  assert len(loss) == _STEPS // 25 + 24 and loss[-1] < loss[0] / 3  # a row per profiled step
  rate = {step: value for _, step, value in
          request("/data/plugin/scalars/scalars?run=train&tag=learning_rate")}
  assert rate[25] < rate[50]  # warming up
  assert rate[50] > rate[100] > rate[175]  # cosine decay


def test_hparams_config_images_and_graph_are_served(tensorboard):
  _, request = tensorboard
  experiment = request("/data/plugin/hparams/experiment", {"experimentName": ""})
  names = {info["name"] for info in experiment["hparamInfos"]}
  assert {"train.steps", "train.learning_rate", "model.name", "runtime.strategy"} <= names
  assert sorted(request("/data/plugin/text/tags")["train"]) == ["config", "model"]
  (model,) = request("/data/plugin/text/text?run=train&tag=model")
  assert "model mnist_cnn: 347,146 parameters (347,146 trainable, 0 not)" in model["text"]
  assert "optimizer adam: Adam" in model["text"]
  assert request("/data/plugin/images/tags")["train"]["input_samples"]["samples"] == 8
  assert "train_loop" in request("/data/plugin/graphs/info")["train"]["tags"]


def test_profile_window_writes_a_trace(tensorboard):
  """Steps 101..125, each a loop of its own with its step marker, once each: what
  TensorBoard's overview and step-time pages show (without: "No step marker observed")."""
  model_dir, _ = tensorboard
  (trace,) = glob.glob(f"{model_dir}/tensorboard/plugins/profile/*/*.xplane.pb")
  assert step_markers(trace) == dict.fromkeys(range(101, 126), 1)


def test_a_row_of_scalars_is_what_tensorboards_own_scalar_summaries_hold():
  """One event per row (trainer/reporters/summaries.py) holds, value for value, the bytes of
  TensorBoard's scalar_pb for each tag: the Scalars tab reads them as tf.summary.scalar's."""
  from tensorboard.compat.proto import summary_pb2  # pylint: disable=import-outside-toplevel
  from tensorboard.plugins.scalar import summary_v2  # pylint: disable=import-outside-toplevel
  from trainer.reporters import summaries  # pylint: disable=import-outside-toplevel
  row = {"loss": 0.25, "accuracy": 1.0, "learning_rate": 1e-3, "examples_per_sec": 12345.6,
         "diverged": float("inf"), "beyond_float32": -1e39, "nan": float("nan"),
         "tiny": 1e-45, "r\u00e9sum\u00e9/\u4e2d": 0.1}
  expected = summary_pb2.Summary(value=[summary_v2.scalar_pb(tag, value).value[0]
                                        for tag, value in row.items()])
  for _ in range(2):  # the tags' bytes serialized, then spliced
    assert summaries._scalars_event(row) == expected.SerializeToString()  # pylint: disable=protected-access
