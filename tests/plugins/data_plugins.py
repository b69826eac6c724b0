"""Data and preprocess plug-ins as new users write them, right and wrong (test_data_refusals.py)."""
import sys

import numpy as np


def _arrays(n, seed=0):
  rng = np.random.default_rng(seed)
  return rng.random((n, 28, 28, 1)).astype(np.float32), (np.arange(n) % 10).astype(np.int64)


# -- data.preprocess: randomness of its own (refused) or from the seed (fine) --------------

def unseeded_flip(features, labels, seed):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  del seed
  return tf.image.random_flip_left_right(features), labels


def unseeded_noise(features, labels, seed):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  del seed
  return features + tf.random.uniform(tf.shape(features), maxval=0.1), labels


_GENERATOR = None


def generator_noise(features, labels, seed):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  global _GENERATOR  # pylint: disable=global-statement
  del seed
  if _GENERATOR is None:
    _GENERATOR = tf.random.Generator.from_seed(1)
  return features + _GENERATOR.normal(tf.shape(features)), labels


_FLIP = None


def keras_random_flip(features, labels, seed):
  import keras  # pylint: disable=g-import-not-at-top
  global _FLIP  # pylint: disable=global-statement
  del seed
  if _FLIP is None:
    _FLIP = keras.layers.RandomFlip("horizontal", seed=3)
  return _FLIP(features, training=True), labels


def seeded_flip(features, labels, seed):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  return tf.image.stateless_random_flip_left_right(features, seed=seed), labels


def exiting_preprocess(features, labels, seed):
  sys.exit(0)


# -- data.name: what a builder returns ------------------------------------------------------

def x_y_instead_of_splits(data_config, seed):
  return _arrays(64)


def dict_labels_numpy(data_config, seed):
  features, labels = _arrays(64)
  return (features, {"digit": labels, "even": labels % 2}), _arrays(16)


def tuple_labels_numpy(data_config, seed):
  features, labels = _arrays(64)
  return (features, (labels, labels % 2)), _arrays(16)


def _stream(make):
  def make_dataset():
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    return make(tf)
  return make_dataset


def dict_labels_stream(data_config, seed):
  features, labels = _arrays(64)
  return (_stream(lambda tf: tf.data.Dataset.from_tensor_slices(
      (features, {"digit": labels, "even": labels % 2}))), _arrays(16))


def varying_length_stream(data_config, seed):
  """Sequences of 3..9 numbers: a new user's text or signal data."""
  def examples():
    for k in range(64):
      yield np.arange(3 + k % 7, dtype=np.float32), np.int64(k % 2)

  def make(tf):
    return tf.data.Dataset.from_generator(examples, output_signature=(
        tf.TensorSpec([None], tf.float32), tf.TensorSpec([], tf.int64)))
  return _stream(make), _stream(make)


def padded_batch_stream(data_config, seed):
  """The same sequences, already padded and batched as a tutorial does it."""
  def examples():
    for k in range(64):
      yield np.arange(3 + k % 7, dtype=np.float32), np.int64(k % 2)

  def make(tf):
    return tf.data.Dataset.from_generator(examples, output_signature=(
        tf.TensorSpec([None], tf.float32), tf.TensorSpec([], tf.int64))).padded_batch(8)
  return _stream(make), _arrays(16)


def exiting_builder(data_config, seed):
  sys.exit(0)


class _FailsOnSeven:
  """Random access; reading example 7 raises (a corrupt record)."""

  def __init__(self, n):
    self.n = n
    self.features, self.labels = _arrays(n)

  def __len__(self):
    return self.n

  def __getitem__(self, indices):
    if 7 in indices and len(indices) > 2:  # past the two-example probe
      raise OSError("record 7 is corrupt")
    return self.features[indices], self.labels[indices]


def fails_on_seven(data_config, seed):
  return _FailsOnSeven(256), _arrays(16)


class _Huge:
  """A billion examples of 1 MiB each, none in memory: random access by index."""

  def __len__(self):
    return 1_000_000_000

  def __getitem__(self, indices):
    return (np.zeros((len(indices), 512, 512, 1), np.float32),
            (np.asarray(indices) % 10).astype(np.int64))


def huge_examples(data_config, seed):
  return _Huge(), _arrays(16)


# -- model.name, train.loss, eval.metrics that end the process ------------------------------

def exiting_model(model_config, input_spec):
  sys.exit(0)


def exiting_loss(labels, outputs):
  sys.exit(3)


# -- model.num_classes=0: integer labels of 4 classes -----------------------------------------

def four_classes(data_config, seed):
  features, labels = _arrays(128)
  eval_features, eval_labels = _arrays(32, seed=1)
  return (features, labels % 4), (eval_features, eval_labels % 4)


def float_labels_stream(data_config, seed):
  features, labels = _arrays(64)
  return (_stream(lambda tf: tf.data.Dataset.from_tensor_slices(
      (features, labels.astype(np.float32)))), (features, labels.astype(np.float32)))
