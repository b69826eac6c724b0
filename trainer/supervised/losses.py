"""`train.loss`: a built-in name or MODULE:FUNCTION, as `loss(labels, outputs) -> per-example`.

Every loss returns one value per example ([batch]); the trainer sums them and
divides by the *global* batch size (trainer/loop/steps.py), so the all-reduced
gradient is that of the global-batch mean for any replica count. Built-ins are
plain tf.nn functions, not Keras `Loss` objects: with the TF backend a Keras
`Loss` already scales by 1/num_replicas in a replica context, which would count
the reduction twice.

The cross-entropies take logits, or probabilities when the model's outputs are
(`train.from_logits`, decided by trainer/supervised/probabilities.py); either way they serve
`probabilities` (the softmax or sigmoid of logits, probabilities as they are).
Every other loss serves the raw outputs as `predictions`. For probabilities the
cross-entropies are Keras's plain ops (clipped to [eps, 1 - eps] as Keras does),
per example.
"""
import keras
import tensorflow as tf

from trainer.setup import plugins


def aligned(labels, outputs):
  """Labels as float32 in the outputs' shape ([b] labels for [b, 1] outputs)."""
  labels = tf.cast(labels, tf.float32)
  if labels.shape.rank == outputs.shape.rank - 1 and outputs.shape[-1] == 1:
    labels = labels[..., tf.newaxis]
  return labels


def mean_over_example(values):
  """[b, ...] -> [b]: the mean over everything but the batch axis."""
  return tf.reduce_mean(tf.reshape(values, [tf.shape(values)[0], -1]), axis=-1)


def sparse_categorical_crossentropy(labels, outputs):
  return tf.nn.sparse_softmax_cross_entropy_with_logits(
      labels=tf.cast(labels, tf.int32), logits=outputs)


def binary_crossentropy(labels, outputs):
  return mean_over_example(tf.nn.sigmoid_cross_entropy_with_logits(
      labels=aligned(labels, outputs), logits=outputs))


def sparse_categorical_crossentropy_of_probabilities(labels, probabilities):
  return keras.ops.sparse_categorical_crossentropy(tf.cast(labels, tf.int32), probabilities,
                                                   from_logits=False)


def binary_crossentropy_of_probabilities(labels, probabilities):
  return mean_over_example(keras.ops.binary_crossentropy(
      aligned(labels, probabilities), probabilities, from_logits=False))


def mean_squared_error(labels, outputs):
  return mean_over_example(tf.square(outputs - aligned(labels, outputs)))


def mean_absolute_error(labels, outputs):
  return mean_over_example(tf.abs(outputs - aligned(labels, outputs)))


BUILTINS = {
    "sparse_categorical_crossentropy": sparse_categorical_crossentropy,
    "binary_crossentropy": binary_crossentropy,
    "mean_squared_error": mean_squared_error,
    "mean_absolute_error": mean_absolute_error,
}

_OF_PROBABILITIES = {
    "sparse_categorical_crossentropy": sparse_categorical_crossentropy_of_probabilities,
    "binary_crossentropy": binary_crossentropy_of_probabilities,
}
_SERVED = {"sparse_categorical_crossentropy": ("probabilities", tf.nn.softmax),
           "binary_crossentropy": ("probabilities", tf.nn.sigmoid)}


def resolve(name: str, *, probabilities: bool = False):
  """The per-example loss function `train.loss` names; `probabilities`: the model's
  outputs are probabilities (the cross-entropies then take them as such)."""
  if probabilities and name in _OF_PROBABILITIES:
    return _OF_PROBABILITIES[name]
  return plugins.resolve("train.loss", name, BUILTINS)


def served_output(name: str, *, probabilities: bool = False):
  """(output name, outputs -> served tensor) of the SavedModel for loss `name`."""
  if probabilities and name in _SERVED:
    return "probabilities", tf.identity  # already probabilities: no second activation
  return _SERVED.get(name, ("predictions", tf.identity))


def is_cross_entropy(name: str) -> bool:
  """A built-in cross-entropy: its outputs are logits unless `train.from_logits` says not."""
  return name in _SERVED


def outputs_are_logits(name: str, probabilities: bool) -> bool:
  return is_cross_entropy(name) and not probabilities
