"""A user's own work, plugged into distloop without editing it: model, data and a metric.

The task: which of three interleaved spiral arms a point lies on. The data is a
random-access source that computes example k from (seed, split, k) when asked,
so nothing is held in memory; features are a dict (the point, and its polar
coordinates), so the SavedModel gets two named inputs.

Run it (my_config.py names the three functions below):

  python -m trainer --config=examples/my_config.py --model_dir=/tmp/distloop/spirals
"""
import keras
import numpy as np
import tensorflow as tf

NUM_ARMS = 3


class SpiralSource:
  """Random access: `source[indices] -> ({"point", "polar"}, labels)`, computed per example."""

  def __init__(self, size: int, seed: int, split: int):
    self.size, self.seed, self.split = size, seed, split

  def __len__(self):
    return self.size

  def __getitem__(self, indices):
    indices = np.asarray(indices, dtype=np.int64)
    # Each example from its own generator: example k is the same whatever the batch.
    draws = np.stack([np.random.default_rng([self.seed, self.split, int(k)]).random(3)
                      for k in indices])
    labels = (draws[:, 0] * NUM_ARMS).astype(np.int64)
    radius = 0.1 + 0.9 * draws[:, 1]
    # Arm `label` winds out from angle 2*pi*label/3; the jitter makes arms touch.
    angle = 2 * np.pi * labels / NUM_ARMS + 4.0 * radius + 1.9 * (draws[:, 2] - 0.5)
    point = np.stack([radius * np.cos(angle), radius * np.sin(angle)], axis=1)
    polar = np.stack([radius, np.arctan2(point[:, 1], point[:, 0]) / np.pi], axis=1)
    return ({"point": point.astype(np.float32), "polar": polar.astype(np.float32)}, labels)


def build_data(data_config, seed):
  """distloop's data plug-in: (train, eval) random-access sources."""
  return (SpiralSource(data_config.num_train_examples, seed, split=0),
          SpiralSource(data_config.num_eval_examples, seed, split=1))


def build_model(model_config, input_spec):
  """distloop's model plug-in: one input per feature of `input_spec`, logits out."""
  inputs = {name: keras.Input(shape=spec.shape[1:], dtype=spec.dtype, name=name)
            for name, spec in input_spec.items()}
  x = keras.layers.Concatenate(name="concat")([inputs["point"], inputs["polar"]])
  for i in range(model_config.depth):  # `depth` and `width` are this project's own fields
    x = keras.layers.Dense(model_config.width, activation="relu", name=f"hidden{i}")(x)
  outputs = keras.layers.Dense(NUM_ARMS, name="logits")(x)
  return keras.Model(inputs, outputs, name="spirals")


def confident_accuracy(labels, outputs):
  """distloop's metric plug-in, per example: right, and with probability >= 0.5."""
  probabilities = tf.nn.softmax(outputs, axis=-1)
  right = tf.argmax(outputs, axis=-1, output_type=tf.int64) == tf.cast(labels, tf.int64)
  return tf.cast(right & (tf.reduce_max(probabilities, axis=-1) >= 0.5), tf.float32)
