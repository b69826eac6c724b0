"""Multi-output models: a loss, weight and metrics per named output, dict labels, every
output served by name (trainer/setup/heads.py).

The model (tests/plugins/multi_output_plugins.py) has two heads on one hidden layer: `class`
(3-class logits) and `value` (a regression). Targets were measured: 300 Adam steps
reach eval class accuracy 0.998 and value MAE 0.17 (predicting the mean: MAE 1.19;
chance accuracy: 0.33).
"""
import json
import os

import numpy as np
import pytest

from tests.support.cli import run_trainer, train_ok

_PLUGINS = "tests.plugins.multi_output_plugins"
_TWO_HEADS = ["--config=synthetic", "--mode=train_and_eval", "--config.train.steps=300",
              "--config.eval.interval=0", f"--config.model.name={_PLUGINS}:two_heads",
              "--config.train.loss=class=sparse_categorical_crossentropy,value=mean_squared_error",
              "--config.eval.metrics=class=accuracy,value=mean_absolute_error"]


def _check_both_heads_learnt(summary: dict, value_weight: float) -> None:
  assert summary["eval_class_accuracy"] >= 0.95, summary
  assert summary["eval_value_mean_absolute_error"] <= 0.3, summary
  # The reported loss is the weighted sum of the heads' losses (as differentiated).
  weighted = summary["eval_class_loss"] + value_weight * summary["eval_value_loss"]
  assert summary["eval_loss"] == pytest.approx(weighted, rel=1e-5)


def _served(export_dir: str) -> dict:
  """The export (a plain SavedModel: no distloop inside) on the eval split: what it serves."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from tests.plugins.multi_output_plugins import _examples  # pylint: disable=g-import-not-at-top
  features, labels = _examples(1000, 2)
  serve = tf.saved_model.load(export_dir).signatures["serving_default"]
  out = {k: v.numpy() for k, v in serve(inputs=tf.constant(features)).items()}
  return {"names": sorted(out), "row_sums": out["class"].sum(axis=1),
          "accuracy": float(np.mean(out["class"].argmax(axis=1) == labels["class"])),
          "mae": float(np.mean(np.abs(out["value"][:, 0] - labels["value"])))}


@pytest.mark.slow  # end to end (CI runs the slow tests too)
def test_two_heads_with_weighted_losses_learn_and_the_export_serves_both(tmp_path):
  """Catches: a head's loss left out or its weight ignored (the value head would not learn,
  or eval_loss would not be the weighted sum), metrics reported without their output's
  name, an export serving one output or the class head's logits."""
  summary = train_ok(tmp_path, *_TWO_HEADS, f"--config.data.name={_PLUGINS}:arrays",
                     "--config.train.loss_weights=value=0.5")
  _check_both_heads_learnt(summary, value_weight=0.5)
  assert {"train_class_loss", "train_value_loss", "train_class_accuracy",
          "train_value_mean_absolute_error"} <= set(summary)
  served = _served(str(tmp_path / "export" / "300"))
  assert served["names"] == ["class", "value"]
  np.testing.assert_allclose(served["row_sums"], 1.0, atol=1e-5)  # probabilities
  assert served["accuracy"] == pytest.approx(summary["eval_class_accuracy"], abs=1e-6)
  assert served["mae"] == pytest.approx(summary["eval_value_mean_absolute_error"], rel=1e-4)
  with open(tmp_path / "metrics.csv") as f:
    assert "value_mean_absolute_error" in f.read()


@pytest.mark.slow
def test_mode_eval_reports_every_output_by_name(tmp_path):
  """--mode=eval's JSON names each output's loss and metrics as training reported them."""
  flags = [*_TWO_HEADS, f"--config.data.name={_PLUGINS}:arrays",
           "--config.train.loss_weights=value=0.5", "--config.train.steps=100"]
  summary = train_ok(tmp_path, *flags)
  evaluated = run_trainer(tmp_path, *flags, "--mode=eval")
  assert evaluated.returncode == 0, evaluated.stderr[-3000:]
  reported = json.loads(evaluated.stdout)
  assert reported["class_accuracy"] == pytest.approx(summary["eval_class_accuracy"])
  assert reported["value_loss"] == pytest.approx(summary["eval_value_loss"])
  assert reported["loss"] == pytest.approx(summary["eval_loss"])


@pytest.mark.slow
@pytest.mark.parametrize("form", ["random_access", "stream"])
def test_dict_labels_from_the_other_source_forms(tmp_path, form):
  """Catches: dict labels dropped, reordered or mismatched to outputs by a source form."""
  summary = train_ok(tmp_path, *_TWO_HEADS, f"--config.data.name={_PLUGINS}:{form}",
                     "--config.train.loss_weights=value=0.5")
  _check_both_heads_learnt(summary, value_weight=0.5)


@pytest.mark.slow
def test_a_zero_weight_head_does_not_learn(tmp_path):
  """The weight reaches the gradient, not only the report: weight 0 leaves the value head
  untrained while the class head learns as before."""
  summary = train_ok(tmp_path, *_TWO_HEADS, f"--config.data.name={_PLUGINS}:arrays",
                     "--config.train.loss_weights=value=0")
  assert summary["eval_class_accuracy"] >= 0.95
  assert summary["eval_value_mean_absolute_error"] > 1.0, summary
  assert summary["eval_loss"] == pytest.approx(summary["eval_class_loss"], rel=1e-6)


@pytest.mark.slow
def test_a_list_of_outputs_ending_in_a_softmax_is_named_by_its_layers(tmp_path):
  """A list-output model's heads are named by model.output_names; its softmax head is
  taken as probabilities (no second activation: it learns, and serves rows summing to 1)."""
  summary = train_ok(tmp_path, *[f for f in _TWO_HEADS if "model.name" not in f],
                     f"--config.model.name={_PLUGINS}:two_heads_list",
                     f"--config.data.name={_PLUGINS}:arrays")
  _check_both_heads_learnt(summary, value_weight=1.0)
  served = _served(str(tmp_path / "export" / "300"))
  np.testing.assert_allclose(served["row_sums"], 1.0, atol=1e-5)
  assert served["accuracy"] >= 0.95


@pytest.mark.parametrize("field, value, says", [
    ("train.loss_weights", "value=x", "'x' (value) is not a number"),
    ("train.loss_weights", "0.5", "must name outputs: OUTPUT=WEIGHT"),
    ("train.loss_weights", "value=-1", "the weight of 'value' must be >= 0"),
    ("train.loss_weights", "vaule=2", "train.loss_weights names ['vaule']"),
    ("train.loss", "class=sparse_categorical_crossentropy,value", "'value' is not OUTPUT=VALUE"),
    ("train.loss", "class=sparse_categorical_crossentropy,value=mse", "train.loss='mse' is unknown"),
    ("eval.metrics", "class=accuracy,=accuracy", "write each output's metric as OUTPUT=METRIC"),
    ("checkpoint.best_metric", "accuracy", "checkpoint.best_metric='accuracy' is not reported "
     "(choose from: loss, class_loss, value_loss, class_accuracy, value_mean_absolute_error)"),
])
def test_per_output_fields_are_checked_before_anything_runs(field, value, says):
  """The config's own checks (no model yet, no TensorFlow): each names its field."""
  import configs  # pylint: disable=g-import-not-at-top
  from trainer.errors import UserError  # pylint: disable=g-import-not-at-top
  from trainer.setup import validation  # pylint: disable=g-import-not-at-top
  config = configs.get("synthetic")
  config.unlock()
  config.train.loss = "class=sparse_categorical_crossentropy,value=mean_squared_error"
  config.eval.metrics = "class=accuracy,value=mean_absolute_error"
  config.checkpoint.keep_best = 1
  config.checkpoint.best_metric = "class_accuracy"
  section, name = field.split(".")
  config[section][name] = value
  with pytest.raises(UserError) as raised:
    validation.check_config(config)
  assert says in str(raised.value)


@pytest.mark.parametrize("flags, says", [
    (["--config.eval.metrics=accuracy"], "does not say which output"),
    pytest.param(
        ["--config.train.loss=klass=sparse_categorical_crossentropy,value=mean_squared_error"],
        "names outputs ['klass', 'value'], but", marks=pytest.mark.slow),
    (["--config.model.name=mlp", "--config.model.num_classes=3",
      "--config.train.loss=mean_squared_error", "--config.eval.metrics="],
     "the labels are a dict (class, value) but model.name='mlp' returns one tensor"),
], ids=["metric_without_output", "loss_of_unknown_output", "dict_labels_one_output"])
def test_mismatches_with_the_model_are_one_line(tmp_path, flags, says):
  """Catches: a misnamed output silently ignored (its head untrained) or a traceback."""
  result = run_trainer(tmp_path / "run", *_TWO_HEADS, f"--config.data.name={_PLUGINS}:arrays",
                       "--config.train.steps=10", *flags)
  assert result.returncode == 2, result.stderr[-3000:]
  assert len(result.error_lines()) == 1 and says in result.stderr, result.stderr[-3000:]
  assert not os.path.exists(tmp_path / "run" / "checkpoints")
