"""A job's own bugs, each as a user writes it, that `python -m trainer.verify` must name:
the check, the first step and the first variable (tests/verify/test_verify.py). Two of
them distloop refuses before the first step (the check is then its one line)."""
import os
import types

import keras
import numpy as np
import tensorflow as tf

import trainer
from tests.plugins import plain_step


def _model():
  return keras.Sequential([keras.Input((28, 28, 1)), keras.layers.Flatten(),
                           keras.layers.Dense(10, name="logits")], name="tiny")


class _Base(trainer.Task):

  def build(self, context):
    self.model = _model()
    self.optimizer = context.optimizer(self.model.trainable_variables)

  def train_step(self, batch, step):
    return plain_step.cross_entropy_step(self.model, self.optimizer, batch, step)


class UnseededUniform(_Base):
  """tf.random.uniform without a seed in train_step: a kernel's hidden state."""

  def train_step(self, batch, step):
    features, labels = batch
    noisy = features + 0.1 * tf.random.uniform(tf.shape(features))
    return super().train_step((noisy, labels), step)


class VariableOutsideTheCheckpoint(_Base):
  """A variable the step updates, held where no checkpoint looks (an object's attribute)."""

  def build(self, context):
    super().build(context)
    self.hidden = types.SimpleNamespace(scale=tf.Variable(1.0, trainable=False))

  def train_step(self, batch, step):
    self.hidden.scale.assign(self.hidden.scale * 0.9)
    features, labels = batch
    return super().train_step((features * self.hidden.scale, labels), step)


class VariableInAList(_Base):
  """The same variable kept in a Python list: distloop walks lists (and dicts, tuples) of
  what a Task holds, so the checkpoint holds it and every check holds."""

  def build(self, context):
    super().build(context)
    self.scales = [tf.Variable(1.0, trainable=False)]

  def train_step(self, batch, step):
    self.scales[0].assign(self.scales[0] * 0.9)
    features, labels = batch
    return super().train_step((features * self.scales[0], labels), step)


class LossOverTheReplicaBatch(_Base):
  """The loss divided by the replica's batch (a mean), not the global one: on 2 replicas
  the gradient is twice what it is on 1."""

  def train_step(self, batch, step):
    features, labels = batch
    with tf.GradientTape() as tape:
      per_example = keras.losses.sparse_categorical_crossentropy(
          labels, self.model(features), from_logits=True)
      loss = tf.reduce_mean(per_example)
    step.minimize(self.optimizer, tape, loss, self.model.trainable_variables)
    return {"loss": per_example}


class PythonCounter(_Base):
  """A Python counter, outside any checkpoint, that halves the input from its 5th step
  on: a resumed process counts from 0 again."""

  def build(self, context):
    super().build(context)
    self.calls = 0

  def _scale(self):
    self.calls += 1
    return np.float32(1.0 if self.calls <= 4 else 0.5)

  def train_step(self, batch, step):
    scale = tf.reshape(tf.numpy_function(self._scale, [], tf.float32, stateful=True), [])
    features, labels = batch
    return super().train_step((features * scale, labels), step)


def _arrays(n: int, seed: int):
  rng = np.random.default_rng(seed)
  labels = (np.arange(n) % 10).astype(np.int64)
  images = rng.random((n, 28, 28, 1)).astype(np.float32) * 0.5
  images[np.arange(n), labels, labels, 0] += 1.0  # learnable
  return images, labels


def ordered_by_the_process(data_config, seed):
  """Rows shuffled by a generator seeded from the process id: another order each process."""
  images, labels = _arrays(256, seed)
  order = np.random.default_rng(os.getpid()).permutation(len(labels))
  return (images[order], labels[order]), _arrays(64, seed + 1)


def in_order(data_config, seed):
  return _arrays(256, seed), _arrays(64, seed + 1)


class MeanNeverReset(LossOverTheReplicaBatch):
  """A Keras Mean the Task holds, updated by eval_step and never reset: each eval a process
  runs adds to the last, so two evals of the same step differ. On LossOverTheReplicaBatch's
  step: two defects that verify names by their own checks, in one verify run."""

  def build(self, context):
    super().build(context)
    self.eval_loss = keras.metrics.Mean()

  def eval_step(self, batch):
    features, labels = batch
    per_example = keras.losses.sparse_categorical_crossentropy(
        labels, self.model(features), from_logits=True)
    self.eval_loss.update_state(per_example)
    return {"loss": per_example, "running_loss": tf.fill(tf.shape(per_example),
                                                         self.eval_loss.result())}
