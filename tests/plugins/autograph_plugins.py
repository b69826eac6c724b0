"""User code that branches and loops on tensors in plain Python, as AutoGraph allows in a
user's own tf.function (tests/loop/test_autograph_scope.py): each raises at trace time if
distloop calls it unconverted."""
import keras
import tensorflow as tf

import trainer


class BranchingTask(trainer.Task):
  """A Task whose step decides on tensors with Python `if` and `for`."""

  def build(self, context):
    self.model = keras.Sequential([keras.Input((28, 28, 1)), keras.layers.Flatten(),
                                   keras.layers.Dense(10)], name="branching")
    self.optimizer = context.optimizer(self.model.trainable_variables)

  def train_step(self, batch, step):
    features, labels = batch
    with tf.GradientTape() as tape:
      per_example = keras.losses.sparse_categorical_crossentropy(
          labels, self.model(features), from_logits=True)
      if tf.reduce_mean(per_example) > 1e6:  # a tensor condition: tf.cond when converted
        per_example = per_example * 0.0
      total = tf.zeros([])
      for _ in tf.range(2):  # a tensor loop: tf.while_loop when converted
        total += tf.reduce_mean(per_example)
      loss = step.replica_loss(per_example)
    step.minimize(self.optimizer, tape, loss, self.model.trainable_variables)
    return {"loss": per_example}

  def eval_step(self, batch):
    features, labels = batch
    per_example = keras.losses.sparse_categorical_crossentropy(
        labels, self.model(features), from_logits=True)
    if tf.reduce_any(per_example < 0):  # never: a loss is >= 0
      per_example = tf.abs(per_example)
    return {"loss": per_example}


def branching_loss(labels, logits):
  per_example = keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)
  if tf.reduce_any(tf.math.is_nan(per_example)):
    per_example = tf.zeros_like(per_example)
  return per_example


def branching_preprocess(features, labels, seed):
  del seed
  if tf.reduce_max(tf.cast(features, tf.float32)) < 0:  # never: uint8 pixels
    features = tf.zeros_like(features)
  return features, labels
