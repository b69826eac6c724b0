"""Keras models as users write them (used by test_keras_models.py): probability heads
and their logits twins, compiled models, an overridden train_step, a regularizer.

The data is learnable and tiny: 8 Gaussian features, the label a linear function's
argmax (4 classes) or sign (binary), so a small model gets most of it in a few
hundred steps.
"""
import keras
import numpy as np

NUM_FEATURES, NUM_CLASSES = 8, 4


def _features(n, rng):
  return rng.normal(size=(n, NUM_FEATURES)).astype(np.float32)


def four_classes(data_config, seed):
  rng = np.random.default_rng(1234)
  weights = rng.normal(size=(NUM_FEATURES, NUM_CLASSES))
  splits = []
  for n in (data_config.num_train_examples, data_config.num_eval_examples):
    features = _features(n, rng)
    splits.append((features, np.argmax(features @ weights, axis=-1).astype(np.int64)))
  return tuple(splits)


def two_classes(data_config, seed):
  rng = np.random.default_rng(4321)
  weights = rng.normal(size=NUM_FEATURES)
  splits = []
  for n in (data_config.num_train_examples, data_config.num_eval_examples):
    features = _features(n, rng)
    splits.append((features, (features @ weights > 0).astype(np.float32)))
  return tuple(splits)


def _classifier(name, input_spec, units, activation):
  return keras.Sequential([
      keras.Input(shape=input_spec.shape[1:]),
      keras.layers.Dense(16, activation="relu", name="hidden"),
      keras.layers.Dense(units, activation=activation, name="head"),
  ], name=name)


def softmax_head(model_config, input_spec):
  return _classifier("classifier", input_spec, NUM_CLASSES, "softmax")


def softmax_head_logits_twin(model_config, input_spec):
  return _classifier("classifier", input_spec, NUM_CLASSES, None)


def sigmoid_head(model_config, input_spec):
  return _classifier("classifier", input_spec, 1, "sigmoid")


def sigmoid_head_logits_twin(model_config, input_spec):
  return _classifier("classifier", input_spec, 1, None)


def one_output(model_config, input_spec):
  return _classifier("classifier", input_spec, 1, None)


class _SoftmaxInside(keras.Model):
  """Subclassed: distloop cannot see its last layer, only its outputs."""

  def __init__(self):
    super().__init__(name="subclassed")
    self.head = keras.layers.Dense(NUM_CLASSES, name="head")

  def call(self, inputs):
    return keras.ops.softmax(self.head(inputs))


def subclassed_softmax(model_config, input_spec):
  return _SoftmaxInside()


def compiled_with_adamw(model_config, input_spec):
  model = softmax_head_logits_twin(model_config, input_spec)
  model.compile(optimizer=keras.optimizers.AdamW(weight_decay=0.004, use_ema=True),
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
  return model


class _OwnTrainStep(keras.Model):

  def train_step(self, data):
    raise NotImplementedError("distloop never calls this")


def own_train_step(model_config, input_spec):
  inputs = keras.Input(shape=input_spec.shape[1:])
  return _OwnTrainStep(inputs, keras.layers.Dense(NUM_CLASSES, name="head")(inputs),
                       name="own_step")


L2 = 0.05


def regularized_linear(model_config, input_spec):
  """Logits = x @ kernel + bias, with an L2 penalty large enough to matter."""
  return keras.Sequential([
      keras.Input(shape=input_spec.shape[1:]),
      keras.layers.Dense(NUM_CLASSES, kernel_regularizer=keras.regularizers.L2(L2), name="head"),
  ], name="linear")


def halving_schedule(train_config):
  """train.lr_schedule plug-in: train.learning_rate, halved every 10 steps."""
  return keras.optimizers.schedules.ExponentialDecay(
      train_config.learning_rate, decay_steps=10, decay_rate=0.5, staircase=True)
