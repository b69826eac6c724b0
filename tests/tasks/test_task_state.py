"""Everything a Task's traced steps use is checkpointed, or the Task is refused in one line.

In-process through trainer.run, a tiny model, plain SGD, a few steps: each resumable Task
trained 3 steps, stopped, and resumed by a fresh instance to step 6 ends where an
uninterrupted 6 steps end (1e-6). Before this, a trained Dense held as an attribute, a
model two containers deep, a tf.random.Generator and a Dropout layer's seed were not
saved (a resume re-initialised them, exit 0), and a variable created in the first
train_step, tf.random.normal, or a variable hidden where the state walk cannot see it
trained on silently.
"""
import types

import keras
import numpy as np
import orbax.checkpoint as ocp
import pytest
import tensorflow as tf
from tensorflow.python.framework import config as tf_config

import configs
import trainer
from trainer.errors import UserError


@pytest.fixture(autouse=True)
def _determinism_restored():
  """runtime.deterministic turns op determinism on for the process: off again after."""
  was = tf_config.is_op_determinism_enabled()
  yield
  if not was:
    tf_config.disable_op_determinism()


def _config(steps: int):
  config = configs.get("synthetic")
  config.unlock()
  config.train.steps, config.train.steps_per_loop = steps, 3
  config.train.global_batch_size = 32
  config.train.optimizer, config.train.learning_rate = "sgd", 0.1
  config.data.num_train_examples, config.data.num_eval_examples = 256, 64
  config.runtime.deterministic = True
  return config


def _per_example_loss(labels, logits):
  return keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)


class _Step(trainer.Task):
  """One SGD update of `self.trainable()` from the loss of `self.logits`."""

  def train_step(self, batch, step):
    features, labels = batch
    with tf.GradientTape() as tape:
      per_example = _per_example_loss(labels, self.logits(features, step))
      loss = step.replica_loss(per_example)
    step.minimize(self.optimizer, tape, loss, self.trainable())
    return {"loss": per_example}


def _model(name: str) -> keras.Model:
  return keras.Sequential([keras.Input((28, 28, 1)), keras.layers.Flatten(),
                           keras.layers.Dense(10)], name=name)


class LayerAttributes(_Step):
  """Layers held as attributes, no model: a trained Dense, and a Dropout whose seed state
  decides which units each step drops."""

  def build(self, context):
    self.dense = keras.layers.Dense(10)
    self.dense.build((None, 28 * 28))
    self.dropout = keras.layers.Dropout(0.5, seed=1)
    self.optimizer = context.optimizer(self.dense.trainable_variables)

  def trainable(self):
    return self.dense.trainable_variables

  def logits(self, features, step):
    return self.dense(self.dropout(tf.reshape(features, [-1, 28 * 28]), training=True))

  def saved(self):
    return [*self.dense.weights, self.dropout.seed_generator.state]


class NestedModel(_Step):
  """A model two containers deep."""

  def build(self, context):
    self.parts = {"heads": [_model("nested")]}
    self.optimizer = context.optimizer(self.trainable())

  def trainable(self):
    return self.parts["heads"][0].trainable_variables

  def logits(self, features, step):
    return self.parts["heads"][0](features)

  def saved(self):
    return self.parts["heads"][0].weights


class GeneratorAttribute(_Step):
  """Input noise from a tf.random.Generator the task holds: its state is the position."""

  def build(self, context):
    self.model = _model("tiny")
    self.rng = tf.random.Generator.from_seed(7)
    self.optimizer = context.optimizer(self.trainable())

  def trainable(self):
    return self.model.trainable_variables

  def logits(self, features, step):
    return self.model(features + self.rng.normal(tf.shape(features)))

  def saved(self):
    return [*self.model.weights, self.rng.state]


class SeedGeneratorAttribute(GeneratorAttribute):
  """Input noise from keras.random with a SeedGenerator the task holds."""

  def build(self, context):
    self.model = _model("tiny")
    self.seeds = keras.random.SeedGenerator(3)
    self.optimizer = context.optimizer(self.trainable())

  def logits(self, features, step):
    return self.model(features + keras.random.normal(tf.shape(features), seed=self.seeds))

  def saved(self):
    return [*self.model.weights, self.seeds.state]


def _checkpoint_keys(model_dir, step: int) -> set:
  def flat(tree, prefix=""):
    for key, value in tree.items():
      yield from flat(value, f"{prefix}{key}/") if isinstance(value, dict) else [prefix + key]
  return set(flat(ocp.PyTreeCheckpointer().restore(f"{model_dir}/checkpoints/{step}/model")))


_SLOW = pytest.mark.slow  # three short runs each (~5 s): the fast suite keeps the first


@pytest.mark.parametrize("task, keys", [
    (LayerAttributes, {"state/dense/kernel", "state/dropout/seed_generator_state"}),
    pytest.param(NestedModel, {"nested/dense/kernel"}, marks=_SLOW),
    pytest.param(GeneratorAttribute, {"tiny/dense/kernel", "state/rng"}, marks=_SLOW),
    pytest.param(SeedGeneratorAttribute, {"tiny/dense/kernel", "state/seeds"}, marks=_SLOW),
])
def test_state_beyond_top_level_models_is_saved_and_a_resume_equals_the_run(tmp_path, task,
                                                                             keys):
  straight = task()
  trainer.run(_config(6), str(tmp_path / "straight"), task=straight)
  trainer.run(_config(3), str(tmp_path / "resumed"), task=task())
  resumed = task()
  assert trainer.run(_config(6), str(tmp_path / "resumed"), task=resumed)["step"] == 6
  assert keys <= _checkpoint_keys(tmp_path / "resumed", 6)
  for expected, actual in zip(straight.saved(), resumed.saved()):
    np.testing.assert_allclose(np.asarray(actual), np.asarray(expected), atol=1e-6, rtol=0,
                               err_msg=expected.path if hasattr(expected, "path") else "")


class VariablesInAList(_Step):
  """A list of the model's variables held as an attribute (the variables it updates), and
  a variable of its own in the same list: each saved once."""

  def build(self, context):
    self.model = _model("tiny")
    self.scale = tf.Variable(1.0, trainable=False,
                             aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
    self.updated = [*self.model.trainable_variables, self.scale]
    self.optimizer = context.optimizer(self.trainable())

  def trainable(self):
    return self.updated[:-1]

  def logits(self, features, step):
    self.scale.assign(self.scale * 0.9)
    return self.model(features) * self.scale

  def saved(self):
    return [*self.model.weights, self.scale]


def test_variables_held_in_a_list_are_saved_once_and_a_resume_equals_the_run(tmp_path):
  straight = VariablesInAList()
  trainer.run(_config(6), str(tmp_path / "straight"), task=straight)
  trainer.run(_config(3), str(tmp_path / "resumed"), task=VariablesInAList())
  resumed = VariablesInAList()
  assert trainer.run(_config(6), str(tmp_path / "resumed"), task=resumed)["step"] == 6
  # Not again as state/updated_0, _1 (the model's kernel and bias) and _2 (self.scale).
  assert _checkpoint_keys(tmp_path / "resumed", 6) == {
      "tiny/dense/kernel", "tiny/dense/bias", "state/scale"}
  for expected, actual in zip(straight.saved(), resumed.saved()):
    np.testing.assert_allclose(np.asarray(actual), np.asarray(expected), atol=1e-6, rtol=0)
  np.testing.assert_allclose(float(resumed.scale.numpy()), 0.9 ** 6, rtol=1e-6)


def test_a_resume_continues_the_learning_rate_schedule_at_its_step(tmp_path):
  """The schedule is a function of the optimizer's step count, which the checkpoint holds:
  3 steps of a rate decaying every step, a resume to 6, end where 6 straight steps end.
  Catches: a step count restored off by one, or not at all (each resumed step would
  take another step's rate; plain SGD at a constant rate cannot tell)."""
  def config(steps):
    config = _config(steps)
    config.train.lr_schedule, config.train.lr_decay_steps = "step", 1
    config.train.lr_decay_rate = 0.7
    return config

  straight = NestedModel()
  trainer.run(config(6), str(tmp_path / "straight"), task=straight)
  trainer.run(config(3), str(tmp_path / "resumed"), task=NestedModel())
  resumed = NestedModel()
  assert trainer.run(config(6), str(tmp_path / "resumed"), task=resumed)["step"] == 6
  assert int(resumed.optimizer.iterations.numpy()) == 6
  for expected, actual in zip(straight.saved(), resumed.saved()):
    np.testing.assert_allclose(np.asarray(actual), np.asarray(expected), atol=1e-6, rtol=0,
                               err_msg=expected.path)


class LazyVariable(NestedModel):
  """A counter created on the first call of train_step."""

  def train_step(self, batch, step):
    if not hasattr(self, "counter"):
      self.counter = tf.Variable(0.0, trainable=False, name="counter")
    self.counter.assign_add(1.0)
    return super().train_step(batch, step)


class StatefulNormal(NestedModel):

  def logits(self, features, step):
    return super().logits(features + tf.random.normal(tf.shape(features)), step)


class KerasGlobalSeed(NestedModel):

  def logits(self, features, step):
    return super().logits(features + keras.random.normal(tf.shape(features)), step)


class StatefulEval(NestedModel):

  def eval_step(self, batch):
    features, labels = batch
    noisy = features + tf.random.uniform(tf.shape(features))
    return {"loss": _per_example_loss(labels, self.parts["heads"][0](noisy))}


class HiddenInClosure(NestedModel):
  """A scale the step reads through a closure: no attribute holds the variable."""

  def build(self, context):
    super().build(context)
    scale = tf.Variable(2.0, trainable=False, name="closure_scale")
    self.scale = lambda: scale

  def logits(self, features, step):
    return super().logits(features * self.scale(), step)


class HiddenInAnObject(NestedModel):
  """A scale held by a plain object the walk does not enter."""

  def build(self, context):
    super().build(context)
    self.box = types.SimpleNamespace(scale=tf.Variable(2.0, trainable=False,
                                                       name="boxed_scale"))

  def logits(self, features, step):
    return super().logits(features * self.box.scale, step)


@pytest.mark.parametrize("task, fragments", [
    (LazyVariable, ["LazyVariable's train_step creates variable 'counter'", "create it in build()"]),
    (StatefulNormal, ["StatefulNormal's train_step draws randomness with a hidden state",
                      "RandomStandardNormal", "step.normal"]),
    (KerasGlobalSeed, ["KerasGlobalSeed's train_step draws randomness from a Keras "
                       "SeedGenerator", "step.normal"]),
    (StatefulEval, ["StatefulEval's eval_step draws randomness with a hidden state",
                    "RandomUniform"]),
    (HiddenInClosure, ["HiddenInClosure's train_step uses variable 'closure_scale:0' that no "
                       "checkpoint would hold", "state()"]),
    (HiddenInAnObject, ["HiddenInAnObject's train_step uses variable 'boxed_scale:0'"]),
])
def test_state_no_checkpoint_would_hold_is_refused_in_one_line(tmp_path, task, fragments):
  with pytest.raises(UserError) as raised:
    trainer.run(_config(3), str(tmp_path / "run"), task=task())
  message = str(raised.value)
  assert "\n" not in message, message
  for fragment in fragments:
    assert fragment in message, message
  assert not (tmp_path / "run").exists()  # nothing written
