"""eval, export and continuous_eval of a model_dir run with the config it recorded
(config.json) unless told otherwise; another config is refused naming config.json."""
import json
import os

import pytest

from configs import recorded
from tests.support.cli import run_trainer, train_ok

# A non-default model: the default config's checkpoint shapes would not fit it.
_TRAINED = ["--config=synthetic", "--config.model.dense_units=16", "--config.train.steps=4",
            "--config.train.steps_per_loop=2", "--config.data.num_train_examples=256",
            "--config.data.num_eval_examples=64", "--config.eval.global_batch_size=32"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  model_dir = tmp_path_factory.mktemp("trained")
  return model_dir, train_ok(model_dir, *_TRAINED, timeout=300)


def _eval(model_dir, *flags):
  result = run_trainer(model_dir, "--mode=eval", *flags, timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  return json.loads(result.stdout.strip().splitlines()[-1]), result.stderr


def test_eval_with_no_flags_uses_the_recorded_config(trained):
  model_dir, summary = trained
  metrics, log = _eval(model_dir)
  assert metrics["step"] == 4 and metrics["examples"] == 64
  assert metrics["loss"] == pytest.approx(summary["eval_loss"], abs=1e-6)
  assert metrics["accuracy"] == pytest.approx(summary["eval_accuracy"], abs=1e-6)
  assert f"with the config recorded in {model_dir}/config.json" in log


def test_config_json_as_config_with_overrides_on_top(trained):
  model_dir, summary = trained
  metrics, _ = _eval(model_dir, f"--config={model_dir}/config.json",
                     "--config.eval.global_batch_size=7")
  assert metrics["examples"] == 64
  assert metrics["loss"] == pytest.approx(summary["eval_loss"], abs=1e-5)


def test_export_with_no_flags(trained):
  model_dir, _ = trained
  result = run_trainer(model_dir, "--mode=export", timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  assert result.stdout.strip().splitlines()[-1] == os.path.join(str(model_dir), "export", "4")


def test_continuous_eval_with_no_flags(trained):
  model_dir, summary = trained
  result = run_trainer(model_dir, "--mode=continuous_eval", timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  assert f"eval at step 4 | loss {summary['eval_loss']:.4f}" in result.stderr


def test_another_config_is_refused_naming_config_json(trained):
  model_dir, _ = trained
  result = run_trainer(model_dir, "--mode=eval", "--config=synthetic", timeout=300)
  assert result.returncode == 2, result.stderr[-3000:]
  lines = result.error_lines()
  assert len(lines) == 1, result.stderr[-3000:]
  assert (f"this model_dir was trained with {model_dir}/config.json: omit --config, or pass "
          f"--config={model_dir}/config.json") in lines[0]


def test_recorded_config_is_the_base_config_with_the_files_values(tmp_path):
  path = tmp_path / "config.json"
  path.write_text(json.dumps({"model": {"dense_units": 16, "width": 3},
                              "train": {"learning_rate": 1}}))
  config = recorded.get_config(str(path))
  assert config.model.dense_units == 16 and config.model.width == 3  # a user's own field
  assert config.train.learning_rate == 1.0 and config.train.steps == 300  # a default
  with pytest.raises(AttributeError):
    config.model.dense_unitz = 3  # locked: a typo is an error
  path.write_text(json.dumps({"train": {"steps": "many"}}))
  with pytest.raises(ValueError, match="train.steps='many' must be of type int"):
    recorded.get_config(str(path))
