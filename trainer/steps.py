"""The compiled part of the loop: the replica step, `steps_per_loop` of them per
tf.function call, and the eval pass. Python never runs between two steps.

Loss scaling: each replica sums its per-example losses and divides by the
*global* batch size (tf.nn.compute_average_loss), so the all-reduced SUM of the
replica gradients is exactly the gradient of the global-batch mean loss, for any
replica count.
"""
import keras
import tensorflow as tf

from trainer import optimizers

_cross_entropy = keras.losses.SparseCategoricalCrossentropy(
    from_logits=True, reduction=None)


class MetricSums:
  """Loss sum, correct count and example count, accumulated on each replica.

  ON_READ/SUM variables: each replica adds to its own copy with no
  communication; reading one (at a loop boundary, a host sync) sums the copies.
  Create inside `strategy.scope()`.
  """

  def __init__(self, name: str):
    def zero(suffix):
      return tf.Variable(0.0, dtype=tf.float64, trainable=False, name=f"{name}_{suffix}",
                         synchronization=tf.VariableSynchronization.ON_READ,
                         aggregation=tf.VariableAggregation.SUM)
    self._loss_sum = zero("loss_sum")
    self._correct = zero("correct")
    self._count = zero("count")

  def update(self, per_example_loss, logits, labels):
    """Replica context: add one batch."""
    predictions = tf.argmax(logits, axis=-1, output_type=labels.dtype)
    self._loss_sum.assign_add(tf.reduce_sum(tf.cast(per_example_loss, tf.float64)))
    self._correct.assign_add(tf.reduce_sum(tf.cast(predictions == labels, tf.float64)))
    self._count.assign_add(tf.cast(tf.size(labels), tf.float64))

  def reset(self):
    for v in (self._loss_sum, self._correct, self._count):
      v.assign(tf.zeros_like(v))

  def result(self) -> dict:
    """Host sync: reads the sums across all replicas."""
    count = float(self._count.numpy())
    return {
        "loss": float(self._loss_sum.numpy()) / max(count, 1.0),
        "accuracy": float(self._correct.numpy()) / max(count, 1.0),
        "examples": int(round(count)),
    }


def make_train_loop(strategy, model, optimizer, metrics: MetricSums, *,
                    global_batch_size: int, communication_options):
  """Returns `train_loop(iterator, num_steps) -> weights_finite`: steps in one tf.function."""
  variables = model.trainable_variables

  def replica_step(batch):
    images, labels = batch
    with tf.GradientTape() as tape:
      logits = model(images, training=True)
      per_example_loss = _cross_entropy(labels, logits)
      loss = tf.nn.compute_average_loss(per_example_loss, global_batch_size=global_batch_size)
      if model.losses:
        loss += tf.nn.scale_regularization_loss(tf.add_n(model.losses))
    grads = tape.gradient(loss, variables)
    context = tf.distribute.get_replica_context()
    # The one and only gradient reduction (see trainer/optimizers.py for why).
    reduced = context.all_reduce(tf.distribute.ReduceOp.SUM, grads,
                                 options=communication_options)
    context.merge_call(
        lambda strategy_, grads_: optimizers.apply_reduced_gradients(
            strategy_, optimizer, grads_, variables),
        args=(reduced,))
    metrics.update(per_example_loss, logits, labels)

  @tf.function
  def train_loop(iterator, num_steps):
    """Runs `num_steps` steps; returns whether every weight is still finite (on device,
    so the loop boundary learns it in the same host sync as the metrics)."""
    for _ in tf.range(num_steps):
      strategy.run(replica_step, args=(next(iterator),))
    return tf.reduce_all([tf.reduce_all(tf.math.is_finite(v)) for v in variables])

  return train_loop


def make_eval_pass(strategy, model, metrics: MetricSums, distributed_dataset):
  """Returns `eval_pass()`: one pass over every example of `distributed_dataset`."""

  def replica_step(batch):
    images, labels = batch
    logits = model(images, training=False)
    metrics.update(_cross_entropy(labels, logits), logits, labels)

  @tf.function
  def eval_pass():
    for batch in distributed_dataset:
      strategy.run(replica_step, args=(batch,))

  return eval_pass
