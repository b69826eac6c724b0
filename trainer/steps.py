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
  `totals()` reads all five at once, so the compiled train loop can return them
  and the loop boundary pays a single host sync. Create inside `strategy.scope()`.
  """

  def __init__(self, name: str):
    def zero(suffix):
      return tf.Variable(0.0, dtype=tf.float64, trainable=False, name=f"{name}_{suffix}",
                         synchronization=tf.VariableSynchronization.ON_READ,
                         aggregation=tf.VariableAggregation.SUM)
    self._loss_sum = zero("loss_sum")
    self._correct = zero("correct")
    self._count = zero("count")
    self._grad_norm_sum = zero("grad_norm_sum")  # training only: the reduced gradient's norm
    self._grad_norm_count = zero("grad_norm_count")
    self._sums = (self._loss_sum, self._correct, self._count, self._grad_norm_sum,
                  self._grad_norm_count)

  def update(self, per_example_loss, logits, labels):
    """Replica context: add one batch."""
    predictions = tf.argmax(logits, axis=-1, output_type=labels.dtype)
    self._loss_sum.assign_add(tf.reduce_sum(tf.cast(per_example_loss, tf.float64)))
    self._correct.assign_add(tf.reduce_sum(tf.cast(predictions == labels, tf.float64)))
    self._count.assign_add(tf.cast(tf.size(labels), tf.float64))

  def update_gradient_norm(self, norm):
    """Replica context: add one step's global norm (every replica adds the same, finite one)."""
    finite = tf.math.is_finite(norm)
    zero = tf.constant(0.0, tf.float64)
    self._grad_norm_sum.assign_add(tf.where(finite, tf.cast(norm, tf.float64), zero))
    self._grad_norm_count.assign_add(tf.where(finite, tf.constant(1.0, tf.float64), zero))

  def reset(self):
    """Cross-replica context (eager or compiled): every replica's copy to zero."""
    for v in self._sums:
      v.assign(tf.zeros_like(v))

  def totals(self):
    """Cross-replica context: the sums over all replicas, one float64 vector."""
    return tf.stack([v.read_value() for v in self._sums])

  def result(self, totals=None) -> dict:
    """Host sync: the metrics from `totals` (as returned by a compiled loop), or read now."""
    loss_sum, correct, count, norm_sum, norm_count = (
        self.totals() if totals is None else totals).numpy().tolist()
    result = {
        "loss": loss_sum / max(count, 1.0),
        "accuracy": correct / max(count, 1.0),
        "examples": int(round(count)),
    }
    if norm_count:
      result["grad_norm"] = norm_sum / norm_count
    return result


def _logits(model, images, training: bool):
  """float32 logits whatever the compute dtype (mixed precision computes in 16 bits)."""
  return tf.cast(model(images, training=training), tf.float32)


def _make_replica_step(model, optimizer, metrics: MetricSums, *, global_batch_size: int,
                       communication_options, loss_scale=None, jit_compile: bool = False,
                       clip_norm: float = 0.0):
  """One optimizer step on this replica's share of a global batch.

  With `jit_compile`, XLA compiles the forward and backward pass; the
  all-reduce and the update stay outside it (XLA cannot compile a merge_call).
  Clipping by global norm happens after the reduction, on the gradient of the
  global batch, identically on every replica.
  """
  variables = model.trainable_variables

  @tf.function(jit_compile=jit_compile, autograph=False)
  def gradients(images, labels):
    with tf.GradientTape() as tape:
      logits = _logits(model, images, training=True)
      per_example_loss = _cross_entropy(labels, logits)
      loss = tf.nn.compute_average_loss(per_example_loss, global_batch_size=global_batch_size)
      if model.losses:
        loss += tf.nn.scale_regularization_loss(tf.add_n(model.losses))
      if loss_scale is not None:  # float16: keep small gradients from underflowing
        loss = loss_scale.scale_loss(loss)
    return tape.gradient(loss, variables), per_example_loss, logits

  def replica_step(batch):
    images, labels = batch
    grads, per_example_loss, logits = gradients(images, labels)
    context = tf.distribute.get_replica_context()
    # The one and only gradient reduction (see trainer/optimizers.py for why).
    reduced = context.all_reduce(tf.distribute.ReduceOp.SUM, grads,
                                 options=communication_options)
    finite = None
    if loss_scale is not None:  # the same reduced gradients, so the same verdict, everywhere
      reduced, finite = loss_scale.unscale(reduced)
    if clip_norm > 0:
      reduced, norm = tf.clip_by_global_norm(reduced, clip_norm)  # norm: before clipping
    else:
      norm = tf.linalg.global_norm(reduced)
    metrics.update_gradient_norm(norm)
    context.merge_call(
        lambda strategy_, grads_, finite_: optimizers.apply_reduced_gradients(
            strategy_, optimizer, grads_, variables, loss_scale=loss_scale, finite=finite_),
        args=(reduced, finite))
    metrics.update(per_example_loss, logits, labels)

  return replica_step


def _all_finite(variables):
  return tf.reduce_all([tf.reduce_all(tf.math.is_finite(v)) for v in variables])


def make_train_loop(strategy, model, optimizer, metrics: MetricSums, *,
                    global_batch_size: int, communication_options, loss_scale=None,
                    jit_compile: bool = False, clip_norm: float = 0.0):
  """Returns `train_loop(iterator, num_steps) -> (weights_finite, metric totals)`: the
  metrics reset, `num_steps` steps and the metrics read, in one tf.function call."""
  replica_step = _make_replica_step(model, optimizer, metrics, global_batch_size=global_batch_size,
                                    communication_options=communication_options,
                                    loss_scale=loss_scale, jit_compile=jit_compile,
                                    clip_norm=clip_norm)

  @tf.function
  def train_loop(iterator, num_steps):
    """Runs `num_steps` steps; returns whether every weight is still finite and the
    metric totals (on device, so the loop boundary reads both in one host sync)."""
    metrics.reset()
    for _ in tf.range(num_steps):
      strategy.run(replica_step, args=(next(iterator),))
    return _all_finite(model.trainable_variables), metrics.totals()

  return train_loop


def make_parameter_server_train_loop(coordinator, model, optimizer, metrics: MetricSums, *,
                                     global_batch_size: int, num_workers: int, loss_scale=None,
                                     jit_compile: bool = False, clip_norm: float = 0.0):
  """The same `train_loop(per_worker_iterator, num_steps) -> (weights_finite, totals)`,
  asynchronous.

  The coordinator schedules the steps as a few closures of compiled steps; any
  free worker runs one, reading and updating the variables on the parameter
  servers. `join()` returns when all have run -- a closure of a worker that
  died is run again elsewhere, so the job survives losing workers.
  """
  strategy = coordinator.strategy
  replica_step = _make_replica_step(model, optimizer, metrics, global_batch_size=global_batch_size,
                                    communication_options=None, loss_scale=loss_scale,
                                    jit_compile=jit_compile, clip_norm=clip_norm)

  @tf.function
  def worker_steps(iterator, num_steps):
    for _ in tf.range(num_steps):
      strategy.run(replica_step, args=(next(iterator),))

  @tf.function
  def weights_finite():
    return _all_finite(model.trainable_variables)

  def train_loop(per_worker_iterator, num_steps):
    metrics.reset()  # the variables live on the parameter servers
    num_steps = int(num_steps)
    pieces = min(num_steps, 2 * num_workers)  # enough to keep every worker busy
    for i in range(pieces):
      chunk = num_steps // pieces + (1 if i < num_steps % pieces else 0)
      coordinator.schedule(worker_steps, args=(per_worker_iterator, tf.constant(chunk)))
    coordinator.join()  # host sync: every scheduled step has run
    return weights_finite(), metrics.totals()

  return train_loop


def make_eval_pass(strategy, model, metrics: MetricSums, dataset):
  """Returns `eval_pass()`: one pass over every example of `dataset`, a distributed
  dataset of `strategy`; with `strategy=None` a plain dataset evaluated right here
  (the parameter-server coordinator, reading the weights from the servers)."""

  def replica_step(batch):
    images, labels = batch
    logits = _logits(model, images, training=False)
    metrics.update(_cross_entropy(labels, logits), logits, labels)

  @tf.function
  def eval_pass():
    for batch in dataset:
      if strategy is None:
        replica_step(batch)
      else:
        strategy.run(replica_step, args=(batch,))

  return eval_pass
