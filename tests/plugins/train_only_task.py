"""A Task with a train_step only, as README.md's my_task.py: no eval_step, no export()
(tests/tasks/test_task_without_eval.py)."""
import keras
import tensorflow as tf

import trainer


class TrainsOnly(trainer.Task):

  def build(self, context):
    self.model = keras.Sequential([keras.Input((28, 28, 1)), keras.layers.Flatten(),
                                   keras.layers.Dense(10, name="logits")], name="tiny")
    self.optimizer = context.optimizer(self.model.trainable_variables)

  def train_step(self, batch, step):
    features, labels = batch
    with tf.GradientTape() as tape:
      per_example = keras.losses.sparse_categorical_crossentropy(
          labels, self.model(features, training=True), from_logits=True)
      loss = step.replica_loss(per_example)
    step.minimize(self.optimizer, tape, loss, self.model.trainable_variables)
    return {"loss": per_example}
