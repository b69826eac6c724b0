"""Plug-ins that are wrong in the ways users get them wrong (used by test_bad_plugins.py)."""
import keras
import numpy as np
import tensorflow as tf


def raising_model(model_config, input_spec):
  raise RuntimeError("cannot build: no GPU here")


def not_a_model(model_config, input_spec):
  return "a string"


def five_classes(model_config, input_spec):
  return keras.Sequential([keras.Input(shape=input_spec.shape[1:]), keras.layers.Flatten(),
                           keras.layers.Dense(5)])


def _arrays(n, label_value=None):
  features = np.random.default_rng(0).random((n, 28, 28, 1)).astype(np.float32)
  labels = np.arange(n) % 10 if label_value is None else np.full(n, label_value)
  return features, labels.astype(np.int64)


def labels_out_of_range(data_config, seed):
  features, labels = _arrays(64)
  labels[17] = 12
  return (features, labels), _arrays(16)


class _Source:
  """Random access; `bad_from`: the first index whose example has another shape."""

  def __init__(self, n, bad_from=None, batch_axis_ok=True):
    self.n, self.bad_from, self.batch_axis_ok = n, bad_from, batch_axis_ok

  def __len__(self):
    return self.n

  def __getitem__(self, indices):
    size = 28 if self.bad_from is None or indices.min() < self.bad_from else 27
    count = len(indices) if self.batch_axis_ok else 1
    return (np.zeros((count, size, size, 1), np.float32), (indices % 10).astype(np.int64))


def wrong_batch_axis(data_config, seed):
  return _Source(64, batch_axis_ok=False), _Source(16)


def shape_changes_midway(data_config, seed):
  return _Source(10_000, bad_from=2), _Source(16)


def not_splits(data_config, seed):
  return [1, 2, 3]


def scalar_loss(labels, outputs):
  return tf.reduce_mean(tf.square(outputs))


def raising_preprocess(features, labels, seed):
  raise ValueError("bad augmentation")
