"""Models with Keras random layers export and serve their inference outputs.

Caught: a model with RandomFlip / RandomRotation trained, then its export crashed
(KeyError: the function captures seed_generator_state, "not reachable from root"):
tf.saved_model.save also traces Keras's default signature of the model, which calls it
without `training`, and those layers (training=True by default) then read
SeedGenerator states that TensorFlow's object graph does not reach. Dropout and
GaussianNoise (training=False by default) exported all along, and still must.
"""
import os

import keras
import numpy as np
import tensorflow as tf

from tests.plugins import shape_plugins
from tests.support.processes import read_checkpoint
from trainer.state import export
from trainer.task import contract

_STEPS = 8
_SPEC = tf.TensorSpec([None, 28, 28, 1], tf.float32, name="images")


def _images(n=5):
  return np.random.default_rng(11).random((n, 28, 28, 1)).astype(np.float32)


def _inference(model, weights: dict, prefix: str, images) -> np.ndarray:
  """The model's softmax with training=False, its variables read from `weights` (the
  checkpoint's model/<model>/<layer>/<variable> arrays)."""
  for layer in model.layers:
    for variable in layer.variables:
      variable.assign(weights[f"{prefix}/{layer.name}/{variable.name}"])
  return tf.nn.softmax(model(tf.constant(images), training=False)).numpy()


def test_a_model_with_random_augmentation_layers_exports_what_it_infers(tmp_path):
  """Trained in process: the export at the end is written, and serves the probabilities
  the checkpointed model gives in inference mode (augmentation off)."""
  import configs  # pylint: disable=g-import-not-at-top
  import trainer  # pylint: disable=g-import-not-at-top
  config = configs.get("synthetic")
  config.unlock()
  config.model.name = "tests.plugins.shape_plugins:augmented"
  config.data.num_train_examples, config.data.num_eval_examples = 256, 64
  config.train.global_batch_size = 32
  config.train.steps = config.train.steps_per_loop = _STEPS
  trainer.run(config, str(tmp_path))
  export_dir = tmp_path / "export" / str(_STEPS)
  assert os.path.isfile(export_dir / "saved_model.pb"), os.listdir(tmp_path)
  serve = tf.saved_model.load(str(export_dir)).signatures["serving_default"]
  images = _images()
  served = serve(images=tf.constant(images))["probabilities"].numpy()
  weights = read_checkpoint(tmp_path, _STEPS, items=("model",))
  expected = _inference(shape_plugins.augmented(None, _SPEC), weights, "model/augmented",
                        images)
  np.testing.assert_allclose(served, expected, atol=1e-6, rtol=0)
  assert not np.allclose(expected, expected[:1])  # the inputs are told apart


def _noisy(model_config, input_spec):
  """Dropout and GaussianNoise: random in training only, by their own default."""
  del model_config
  inputs = keras.Input(shape=input_spec.shape[1:], name="images")
  x = keras.layers.Flatten(name="flat")(inputs)
  x = keras.layers.GaussianNoise(0.5, seed=4, name="noise")(x)
  x = keras.layers.Dense(16, activation="relu", name="hidden")(x)
  x = keras.layers.Dropout(0.3, seed=5, name="dropout")(x)
  return keras.Model(inputs, keras.layers.Dense(10, name="logits")(x), name="noisy")


def test_the_start_up_trace_and_the_export_serve_random_layers_in_inference(tmp_path):
  """`trace` (the start-up check) and `export_saved_model` directly: the augmented model
  and one with Dropout + GaussianNoise both serve their training=False outputs."""
  for build in (shape_plugins.augmented, _noisy):
    model = build(None, _SPEC)
    served = contract.Export(model=model, output_name="probabilities",
                             transform=tf.nn.softmax, input_spec=_SPEC,
                             build=lambda spec, build=build: build(None, spec))
    export.trace(served)
    destination = str(tmp_path / model.name)
    export.export_saved_model(served, destination)
    serve = tf.saved_model.load(destination).signatures["serving_default"]
    images = _images()
    np.testing.assert_allclose(
        serve(images=tf.constant(images))["probabilities"].numpy(),
        tf.nn.softmax(model(tf.constant(images), training=False)).numpy(),
        atol=1e-6, rtol=0, err_msg=model.name)
