"""Keras models as users write them train correctly or are refused in one line.

- A softmax or sigmoid head (every keras.applications classifier) trains as its
  logits twin does and its export serves its own outputs, not a second
  softmax/sigmoid of them (train.from_logits=auto); train.from_logits=true on such a
  head, or a head distloop cannot see that outputs probabilities, is refused.
- A model compile()d with an optimizer and loss, or overriding train_step, is refused
  (distloop would ignore them), with nothing written.
- The reported training loss includes the regularization the gradient includes.
- One output under the default sparse cross-entropy points at binary_crossentropy.

Plug-ins: tests/plugins/keras_plugins.py.
"""
import os

import numpy as np
import pytest

from tests.plugins import keras_plugins
from tests.support.cli import run_trainer, train_ok
from tests.support.processes import checkpoint_arrays

_PLUGINS = "tests.plugins.keras_plugins"
_EXAMPLES = {"num_train_examples": 2048, "num_eval_examples": 512}
_STEPS = 200


def _flags(model: str, data: str, *extra: str) -> list[str]:
  return [f"--config.model.name={_PLUGINS}:{model}", f"--config.data.name={_PLUGINS}:{data}",
          *(f"--config.data.{field}={value}" for field, value in _EXAMPLES.items()),
          f"--config.train.steps={_STEPS}", "--config.train.steps_per_loop=100",
          "--config.train.learning_rate=0.01", f"--config.checkpoint.interval={_STEPS}", *extra]


def _eval_split(data: str):
  config = type("DataConfig", (), dict(_EXAMPLES))
  return getattr(keras_plugins, data)(config, seed=0)[1]


def _served(model_dir, step: int, features: np.ndarray) -> dict:
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  serve = tf.saved_model.load(os.path.join(str(model_dir), "export", str(step))
                              ).signatures["serving_default"]
  return {name: value.numpy() for name, value in serve(inputs=tf.constant(features)).items()}


def _head_outputs(model_dir, step: int, features: np.ndarray) -> np.ndarray:
  """The trained model's own outputs before its final activation, from the checkpoint."""
  weights = checkpoint_arrays(model_dir, step)
  hidden = np.maximum(features @ weights["model/classifier/hidden/kernel"]
                      + weights["model/classifier/hidden/bias"], 0.0)
  return hidden @ weights["model/classifier/head/kernel"] + weights["model/classifier/head/bias"]


def _softmax(logits):
  exp = np.exp(logits - logits.max(axis=-1, keepdims=True))
  return exp / exp.sum(axis=-1, keepdims=True)


def _one_error_line(result, *fragments: str) -> str:
  assert result.returncode == 2, result.stderr[-3000:]
  lines = result.error_lines()
  assert len(lines) == 1 and lines[0].startswith("distloop: error: "), lines
  for fragment in fragments:
    assert fragment in lines[0], lines[0]
  return lines[0]


def _assert_nothing_written(model_dir) -> None:
  assert not os.path.exists(model_dir) or not os.listdir(model_dir), os.listdir(model_dir)


def _assert_serves_its_own_probabilities(model_dir, data: str, activation, accuracy: float):
  features, labels = _eval_split(data)
  served = _served(model_dir, _STEPS, features)["probabilities"]
  own = activation(_head_outputs(model_dir, _STEPS, features))
  # The model's own probabilities, not a second softmax/sigmoid of them.
  np.testing.assert_allclose(served, own, atol=1e-5, rtol=0)
  if served.shape[-1] == 1:
    served_accuracy = np.mean((served[:, 0] > 0.5) == (labels > 0.5))
  else:
    served_accuracy = np.mean(served.argmax(-1) == labels)
  assert served_accuracy == pytest.approx(accuracy, abs=1e-9)


def _sigmoid(logits):
  return 1 / (1 + np.exp(-logits))


def test_a_sigmoid_head_learns_and_serves_its_own_probabilities(tmp_path):
  # Its sigmoid applied twice, it stayed at the base rate; its export served sigmoid(p).
  summary = train_ok(tmp_path, *_flags("sigmoid_head", "two_classes",
                                       "--config.train.loss=binary_crossentropy"))
  assert summary["eval_accuracy"] >= 0.9
  _assert_serves_its_own_probabilities(tmp_path, "two_classes", _sigmoid,
                                       summary["eval_accuracy"])


@pytest.mark.slow  # four trainings
@pytest.mark.parametrize("head, data, loss, activation", [
    ("softmax_head", "four_classes", "sparse_categorical_crossentropy", _softmax),
    ("sigmoid_head", "two_classes", "binary_crossentropy", _sigmoid),
])
def test_a_probability_head_trains_as_its_logits_twin_and_serves_its_own_outputs(
    tmp_path, head, data, loss, activation):
  loss_flag = f"--config.train.loss={loss}"
  with_head = train_ok(tmp_path / "head", *_flags(head, data, loss_flag))
  twin = train_ok(tmp_path / "twin", *_flags(f"{head}_logits_twin", data, loss_flag))
  # The same layers and initial weights, and the same loss up to rounding: the same result.
  assert twin["eval_accuracy"] >= 0.9
  assert with_head["eval_accuracy"] == pytest.approx(twin["eval_accuracy"], abs=0.01)
  assert with_head["eval_loss"] == pytest.approx(twin["eval_loss"], rel=0.05)
  _assert_serves_its_own_probabilities(tmp_path / "head", data, activation,
                                       with_head["eval_accuracy"])


def test_from_logits_true_on_a_softmax_head_is_refused(tmp_path):
  result = run_trainer(tmp_path / "run", *_flags("softmax_head", "four_classes",
                                                 "--config.train.from_logits=true"))
  _one_error_line(result, "train.from_logits=true", "softmax", "twice")
  _assert_nothing_written(tmp_path / "run")


def test_probabilities_from_a_layer_it_cannot_see_are_refused_as_ambiguous(tmp_path):
  result = run_trainer(tmp_path / "run", *_flags("subclassed_softmax", "four_classes"))
  _one_error_line(result, "train.from_logits=false", "probabilities")


def test_a_compiled_model_is_refused_naming_what_would_be_ignored(tmp_path):
  result = run_trainer(tmp_path / "run", *_flags("compiled_with_adamw", "four_classes"))
  line = _one_error_line(result, "compile", "AdamW(", "weight_decay=0.004", "use_ema=True",
                         "SparseCategoricalCrossentropy", "train.optimizer", "train.loss")
  assert "learning_rate=" not in line  # AdamW's default: not worth naming
  _assert_nothing_written(tmp_path / "run")


def test_a_model_with_its_own_train_step_is_refused(tmp_path):
  result = run_trainer(tmp_path / "run", *_flags("own_train_step", "four_classes"))
  _one_error_line(result, "overrides train_step", "not supported")
  _assert_nothing_written(tmp_path / "run")


def test_one_output_under_the_sparse_cross_entropy_points_at_binary_crossentropy(tmp_path):
  result = run_trainer(tmp_path / "run", *_flags("one_output", "two_classes"))
  line = _one_error_line(result, "one value per example", "train.loss=binary_crossentropy")
  assert "num_classes" not in line  # a field of the built-in models only


def test_the_reported_train_loss_includes_the_regularization(tmp_path):
  # One full-data batch per step and one step per loop: the last loop's loss is the
  # mean cross-entropy over every training example at the weights of step N-1
  # (checkpointed), plus the L2 penalty of those weights.
  steps, n = 6, 256
  summary = train_ok(tmp_path, f"--config.model.name={_PLUGINS}:regularized_linear",
                     f"--config.data.name={_PLUGINS}:four_classes",
                     f"--config.data.num_train_examples={n}",
                     "--config.data.num_eval_examples=64", f"--config.train.steps={steps}",
                     f"--config.train.global_batch_size={n}", "--config.train.steps_per_loop=1",
                     "--config.train.learning_rate=0.1", "--config.checkpoint.interval=1",
                     "--config.checkpoint.async_save=false")
  weights = checkpoint_arrays(tmp_path, steps - 1)
  kernel, bias = weights["model/linear/head/kernel"], weights["model/linear/head/bias"]
  config = type("DataConfig", (), {"num_train_examples": n, "num_eval_examples": 64})
  (features, labels), _ = keras_plugins.four_classes(config, seed=0)
  probabilities = _softmax(features.astype(np.float64) @ kernel + bias)
  data_loss = -np.log(probabilities[np.arange(n), labels]).mean()
  regularization = keras_plugins.L2 * np.sum(np.square(kernel.astype(np.float64)))
  assert regularization > 0.1 * data_loss  # large enough to matter
  assert summary["train_loss"] == pytest.approx(data_loss + regularization, rel=1e-5)
  assert summary["train_regularization_loss"] == pytest.approx(regularization, rel=1e-5)
