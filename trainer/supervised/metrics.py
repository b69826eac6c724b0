"""`eval.metrics`: built-in names or MODULE:FUNCTION, each `metric(labels, outputs) -> per-example`.

A metric returns one value per example; the trainer sums the values and the
example count on every replica and divides once, at the end (trainer/loop/steps.py
`MetricSums`), so each is the exact mean over every example of the split, any
replica count and the partial last batch included. Reported as
`eval_<name>` (summary.json), `eval/<name>` (TensorBoard) and `<name>` (`--mode=eval`).
"""
import functools

import tensorflow as tf

from trainer.supervised import losses
from trainer.setup import plugins
from trainer.setup import validation


def accuracy(labels, outputs, *, threshold: float = 0.0):
  """Argmax of the outputs equals the label; with one output, `output > threshold` does."""
  if outputs.shape[-1] == 1 or outputs.shape.rank == 1:
    predicted = tf.cast(tf.reshape(outputs, [-1]) > threshold, tf.float32)
    return tf.cast(predicted == tf.cast(tf.reshape(labels, [-1]), tf.float32), tf.float32)
  predicted = tf.argmax(outputs, axis=-1, output_type=tf.int64)
  return tf.cast(predicted == tf.cast(labels, tf.int64), tf.float32)


def binary_accuracy(labels, outputs, *, threshold: float = 0.0):
  """Per output, `output > threshold` equals `label > 0.5`; the mean over outputs."""
  labels = losses.aligned(labels, outputs)
  right = tf.cast((outputs > threshold) == (labels > 0.5), tf.float32)
  return losses.mean_over_example(right)


def top_k_accuracy(labels, outputs, *, k: int):
  return tf.cast(tf.math.in_top_k(tf.cast(tf.reshape(labels, [-1]), tf.int32), outputs, k),
                 tf.float32)


def resolve(eval_config, loss_name: str, *, probabilities: bool = False,
            specs: list[str] | None = None) -> dict:
  """{name: per-example function} for `eval.metrics` (or `specs`, one output's share of
  it: trainer/setup/heads.py).

  Thresholds follow the outputs: logits (threshold 0) under the cross-entropies
  unless `probabilities` (train.from_logits), probabilities or values (threshold
  0.5) otherwise.
  """
  threshold = 0.0 if losses.outputs_are_logits(loss_name, probabilities) else 0.5
  builtins = {
      "accuracy": functools.partial(accuracy, threshold=threshold),
      "top_k_accuracy": functools.partial(top_k_accuracy, k=eval_config.top_k),
      "binary_accuracy": functools.partial(binary_accuracy, threshold=threshold),
      "mean_absolute_error": losses.mean_absolute_error,
      "mean_squared_error": losses.mean_squared_error,
  }
  resolved = {}
  for spec in validation.metric_specs(eval_config) if specs is None else specs:
    name = plugins.name_of(spec)
    if name in resolved or name in ("loss", "examples"):
      raise plugins.UserError(f"eval.metrics: the name {name!r} is given twice or is reserved")
    resolved[name] = plugins.resolve("eval.metrics", spec, builtins)
  return resolved
