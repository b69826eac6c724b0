"""The default config, trained through the CLI: accuracy, and every output the contract names."""
import glob
import hashlib
import json
import os

import numpy as np
import pytest
from tensorboard.backend.event_processing import event_accumulator
from tensorboard.util import tensor_util

from tests.support.cli import run_python, run_trainer, train_ok
from tests.support.processes import assert_same_state, checkpoint_arrays


@pytest.fixture(scope="module")
def default_run(tmp_path_factory):
  model_dir = tmp_path_factory.mktemp("default")
  summary = train_ok(model_dir, "--config=synthetic")
  return model_dir, summary


def _scalars(event_dir):
  accumulator = event_accumulator.EventAccumulator(
      str(event_dir), size_guidance={event_accumulator.TENSORS: 0})
  accumulator.Reload()
  scalar_tags = [tag for tag in accumulator.Tags()["tensors"]
                 if accumulator.SummaryMetadata(tag).plugin_data.plugin_name == "scalars"]
  return {tag: [float(tensor_util.make_ndarray(e.tensor_proto)) for e in accumulator.Tensors(tag)]
          for tag in scalar_tags}


def test_default_config_learns(default_run):
  _, summary = default_run
  assert summary["step"] == 300
  assert summary["eval_accuracy"] >= 0.95
  assert summary["eval_examples"] == 2000


def test_summary_json_has_the_contract_fields(default_run):
  _, summary = default_run
  for field in ("step", "train_loss", "eval_accuracy", "eval_loss", "eval_examples",
                "examples_per_sec", "wall_time_sec", "train_time_sec"):
    assert field in summary, field
  assert summary["examples_per_sec"] > 0


def test_config_json_is_the_resolved_config(default_run):
  model_dir, _ = default_run
  config = json.loads((model_dir / "config.json").read_text())
  assert config["train"]["steps"] == 300 and config["data"]["name"] == "synthetic"


def test_tensorboard_has_the_contract_tags(default_run):
  model_dir, _ = default_run
  train = _scalars(model_dir / "tensorboard" / "train")
  assert {"loss", "accuracy", "learning_rate", "examples_per_sec"} <= set(train)
  assert train["loss"][-1] < train["loss"][0]
  eval_ = _scalars(model_dir / "tensorboard" / "eval")
  assert {"loss", "accuracy"} <= set(eval_)


def test_checkpoint_is_readable_by_plain_orbax(default_run):
  model_dir, _ = default_run
  code = ("import orbax.checkpoint as ocp, sys\n"
          f"tree = ocp.PyTreeCheckpointer().restore('{model_dir}/checkpoints/300/model')\n"
          "print(tree['mnist_cnn']['conv']['kernel'].shape, tree['mnist_cnn']['logits']['bias'].shape)\n"
          "assert 'trainer' not in sys.modules and 'models' not in sys.modules\n")
  assert run_python(code).strip() == "(3, 3, 1, 32) (10,)"


def test_export_serves_probabilities(default_run):
  model_dir, _ = default_run
  code = ("import numpy as np, tensorflow as tf\n"
          f"served = tf.saved_model.load('{model_dir}/export/300').signatures['serving_default']\n"
          "out = served(images=tf.zeros([5, 28, 28, 1]))['probabilities'].numpy()\n"
          "print(out.shape, np.allclose(out.sum(-1), 1.0, atol=1e-5))\n"
          "print(served.structured_input_signature[1]['images'])\n")
  lines = run_python(code).strip().splitlines()
  assert lines[0] == "(5, 10) True"
  assert "shape=(None, 28, 28, 1)" in lines[1] and "float32" in lines[1]


def _digest(model_dir):
  paths = sorted(p for p in glob.glob(f"{model_dir}/**", recursive=True) if os.path.isfile(p))
  return {p: hashlib.md5(open(p, "rb").read()).hexdigest() for p in paths}


def test_rerunning_a_finished_job_is_a_quick_no_op(default_run):
  model_dir, _ = default_run
  before = _digest(model_dir)
  result = run_trainer(model_dir, "--config=synthetic", timeout=60)
  assert result.returncode == 0
  assert "Already finished at step 300" in result.stdout
  assert _digest(model_dir) == before


def test_eval_mode_prints_json(default_run):
  model_dir, summary = default_run
  result = run_trainer(model_dir, "--config=synthetic", "--mode=eval")
  assert result.returncode == 0, result.stderr
  metrics = json.loads(result.stdout.strip().splitlines()[-1])
  assert metrics["step"] == 300 and metrics["examples"] == 2000
  assert metrics["accuracy"] == pytest.approx(summary["eval_accuracy"], abs=1e-9)


def test_another_model_in_the_same_model_dir_is_refused(default_run):
  model_dir, _ = default_run
  before = _digest(model_dir)
  result = run_trainer(model_dir, "--config=synthetic", "--config.model.dense_units=32",
                       "--config.train.steps=400")
  assert result.returncode == 2
  assert len(result.error_lines()) == 1
  # Refused from config.json before TensorFlow starts (trainer/state/config_changes.py).
  assert (f"model.dense_units=32, but {model_dir} was trained with model.dense_units=64"
          in result.stderr)
  assert _digest(model_dir) == before


def test_training_continues_from_the_latest_checkpoint(tmp_path):
  first = train_ok(tmp_path, "--config=synthetic", "--config.train.steps=100")
  assert first["step"] == 100
  result = run_trainer(tmp_path, "--config=synthetic", "--config.train.steps=150")
  assert result.returncode == 0, result.stderr
  assert "Restored checkpoint at step 100" in result.stderr
  assert "from step 100 to 150" in result.stderr
  assert json.loads((tmp_path / "summary.json").read_text())["step"] == 150
  assert sorted(os.listdir(tmp_path / "export")) == ["100", "150"]


def test_eval_without_a_checkpoint_is_refused(tmp_path):
  result = run_trainer(tmp_path / "empty", "--config=synthetic", "--mode=eval")
  assert result.returncode == 2 and "no checkpoint" in result.stderr
  assert not (tmp_path / "empty").exists()


def test_mlp_with_sgd_trains(tmp_path):
  summary = train_ok(tmp_path, "--config=synthetic", "--config.model.name=mlp",
                     "--config.train.optimizer=momentum", "--config.train.learning_rate=0.05",
                     "--config.train.steps=200")
  assert summary["eval_accuracy"] > 0.8


@pytest.mark.slow  # a whole training run or two: the fast suite's time (CI runs it)
def test_one_device_strategy_trains_to_the_weights_of_default(tmp_path):
  flags = ["--config=synthetic", "--config.train.steps=40", "--config.runtime.deterministic=true"]
  summary = train_ok(tmp_path / "one_device", *flags, "--config.runtime.strategy=one_device")
  assert summary["num_replicas"] == 1 and summary["strategy"] == "one_device"
  train_ok(tmp_path / "default", *flags)
  one_device = checkpoint_arrays(tmp_path / "one_device", 40)
  assert np.abs(one_device["model/mnist_cnn/logits/bias"]).max() > 1e-3  # it trained
  assert_same_state(one_device, checkpoint_arrays(tmp_path / "default", 40), atol=1e-6)
