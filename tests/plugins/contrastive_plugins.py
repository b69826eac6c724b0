"""A contrastive Task: global negatives with step.all_gather, per-example augmentation
with step.example_seeds (tests/tasks/test_task_helpers.py: the same on 1 and 2 replicas)."""
import keras
import tensorflow as tf

import trainer


class Contrastive(trainer.Task):
  """Each example against every augmented example of the global batch."""

  def build(self, context):
    self.model = keras.Sequential([keras.Input((28, 28, 1)), keras.layers.Flatten(),
                                   keras.layers.Dense(8)], name="enc")
    self.optimizer = context.optimizer(self.model.trainable_variables)

  def train_step(self, batch, step):
    features, _ = batch
    seeds = step.example_seeds()
    augmented = tf.map_fn(lambda a: tf.image.stateless_random_flip_left_right(a[0], a[1]),
                          (features, seeds), fn_output_signature=features.dtype)
    with tf.GradientTape() as tape:
      a = tf.math.l2_normalize(self.model(features), -1)
      b = tf.math.l2_normalize(self.model(augmented), -1)
      all_b = step.all_gather(b)
      logits = tf.matmul(a, all_b, transpose_b=True) / 0.1
      rows = tf.shape(a)[0]
      labels = tf.range(rows) + tf.distribute.get_replica_context().replica_id_in_sync_group * rows
      per_example = tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits)
      loss = step.replica_loss(per_example)
    step.minimize(self.optimizer, tape, loss, self.model.trainable_variables)
    return {"loss": per_example}
