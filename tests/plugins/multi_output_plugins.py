"""A two-head model and its data, in the three source forms (tests/tasks/test_multi_output.py).

Each example: 8 features; `class` = which of 3 centres it was drawn near (a
classification head, logits), `value` = a linear function of the features (a
regression head). Both are learnable to a stated target in a few hundred steps.
"""
import keras
import numpy as np
import tensorflow as tf

_CENTRES = np.random.default_rng(7).normal(0, 2.0, (3, 8)).astype(np.float32)
_WEIGHTS = np.linspace(-1.0, 1.0, 8).astype(np.float32)


def _examples(count: int, seed: int):
  rng = np.random.default_rng(seed)
  classes = rng.integers(0, 3, count)
  features = (_CENTRES[classes] + rng.normal(0, 0.7, (count, 8))).astype(np.float32)
  values = (features @ _WEIGHTS + 0.5).astype(np.float32)
  return features, {"class": classes.astype(np.int64), "value": values}


def arrays(data_config, seed):
  del data_config, seed
  return _examples(4096, 1), _examples(1000, 2)


class _RandomAccess:
  def __init__(self, features, labels):
    self.features, self.labels_ = features, labels

  def __len__(self):
    return len(self.features)

  def __getitem__(self, indices):
    return self.features[indices], {k: v[indices] for k, v in self.labels_.items()}


def random_access(data_config, seed):
  del data_config, seed
  return _RandomAccess(*_examples(4096, 1)), _RandomAccess(*_examples(1000, 2))


def stream(data_config, seed):
  del data_config, seed
  def split(seed, count):
    return lambda: tf.data.Dataset.from_tensor_slices(_examples(count, seed))
  return split(1, 4096), split(2, 1000)


def two_heads(model_config, input_spec):
  del model_config
  inputs = keras.Input(input_spec.shape[1:], dtype=input_spec.dtype)
  hidden = keras.layers.Dense(32, activation="relu")(inputs)
  return keras.Model(inputs, {"class": keras.layers.Dense(3)(hidden),
                              "value": keras.layers.Dense(1)(hidden)})


def two_heads_list(model_config, input_spec):
  """The same as a list of outputs, named by their layers; the class head ends in a
  softmax (probabilities: no second activation)."""
  del model_config
  inputs = keras.Input(input_spec.shape[1:], dtype=input_spec.dtype)
  hidden = keras.layers.Dense(32, activation="relu")(inputs)
  return keras.Model(inputs, [keras.layers.Dense(3, activation="softmax", name="class")(hidden),
                              keras.layers.Dense(1, name="value")(hidden)])
