"""BatchNorm models and small learnable images as plug-ins (test_batchnorm_eval.py): the kind
of model (every Keras Application) that broke on an eval replica's empty slice."""
import keras
import numpy as np

_NUM_CLASSES = 4
_IMAGE_SHAPE = (32, 32, 3)


def images(data_config, seed):
  """(train, eval) 32x32x3 float32 images whose label is the brightest colour channel."""
  rng = np.random.default_rng(seed)

  def split(count):
    labels = rng.integers(0, _NUM_CLASSES, size=count).astype(np.int32)
    pixels = rng.uniform(0.0, 0.5, size=(count, *_IMAGE_SHAPE)).astype(np.float32)
    channel = np.minimum(labels, _IMAGE_SHAPE[-1] - 1)  # class 3: no channel brightened
    bright = (labels < _IMAGE_SHAPE[-1]).astype(np.float32)[:, None, None]
    pixels[np.arange(count), :, :, channel] += 0.5 * bright
    return pixels, labels

  return split(data_config.num_train_examples), split(data_config.num_eval_examples)


def conv_batchnorm(model_config, input_spec):
  """Conv -> BatchNorm -> ReLU -> global average pooling -> logits."""
  del model_config
  return _conv_batchnorm(input_spec, synchronized=False, name="conv_batchnorm")


def conv_batchnorm_synchronized(model_config, input_spec):
  """conv_batchnorm with BatchNormalization(synchronized=True): the statistics of the global
  batch on any replica count (Keras, TensorFlow backend), so its trajectory does not depend
  on the replica count and an elastic resume of it is not refused."""
  del model_config
  return _conv_batchnorm(input_spec, synchronized=True, name="conv_batchnorm_synchronized")


def _conv_batchnorm(input_spec, *, synchronized: bool, name: str):
  inputs = keras.Input(shape=input_spec.shape[1:], name="images")
  x = keras.layers.Conv2D(16, 3, padding="same", use_bias=False, name="conv")(inputs)
  x = keras.layers.BatchNormalization(synchronized=synchronized, name="bn")(x)
  x = keras.layers.ReLU(name="relu")(x)
  x = keras.layers.GlobalAveragePooling2D(name="pool")(x)
  return keras.Model(inputs, keras.layers.Dense(_NUM_CLASSES, name="logits")(x), name=name)


def mobilenet_v3_small(model_config, input_spec):
  """keras.applications.MobileNetV3Small, random weights, logits out; the images are in
  [0, 1], so its own rescaling to [-1, 1] stays out."""
  del model_config
  return keras.applications.MobileNetV3Small(
      input_shape=tuple(input_spec.shape[1:]), weights=None, classes=_NUM_CLASSES,
      classifier_activation=None, include_preprocessing=False, minimalistic=False)
