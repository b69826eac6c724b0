"""The compiled part of the loop: the replica step (any model, loss and metrics), `steps_per_loop` of them per
tf.function call, and the eval pass. Python never runs between two steps.

Loss scaling: each replica sums its per-example losses and divides by the
*global* batch size (tf.nn.compute_average_loss), so the all-reduced SUM of the
replica gradients is exactly the gradient of the global-batch mean loss, for any
replica count.
"""
import tensorflow as tf

from trainer import optimizers


class MetricSums:
  """Per-example sums (the loss and every metric) and the example count, on each replica.

  ON_READ/SUM variables: each replica adds to its own copy with no
  communication; reading one (at a loop boundary, a host sync) sums the copies.
  `totals()` reads them at once, so the compiled train loop can return them and
  the loop boundary pays a single host sync. Dividing the sums by the count
  once, at the end, makes each metric the exact mean over every example.
  Create inside `strategy.scope()`.
  """

  def __init__(self, name: str, loss_fn, metric_fns: dict):
    self._loss_fn = loss_fn
    self._metric_fns = dict(metric_fns)
    self._names = ["loss", *self._metric_fns]
    def zero(suffix, size):
      return tf.Variable(tf.zeros([size], tf.float64), trainable=False, name=f"{name}_{suffix}",
                         synchronization=tf.VariableSynchronization.ON_READ,
                         aggregation=tf.VariableAggregation.SUM)
    self._sums = zero("sums", len(self._names) + 1)  # [count, loss, metric...]
    self._grad_norm = zero("grad_norm", 2)  # training only: [sum of norms, steps]

  def per_example_loss(self, labels, outputs):
    return self._loss_fn(labels, outputs)

  def update(self, per_example_loss, outputs, labels):
    """Replica context: add one batch."""
    values = [per_example_loss] + [fn(labels, outputs) for fn in self._metric_fns.values()]
    sums = [tf.reduce_sum(tf.cast(v, tf.float64)) for v in values]
    count = tf.cast(tf.shape(per_example_loss)[0], tf.float64)
    self._sums.assign_add(tf.stack([count, *sums]))

  def update_gradient_norm(self, norm):
    """Replica context: add one step's global norm (every replica adds the same, finite one)."""
    finite = tf.math.is_finite(norm)
    self._grad_norm.assign_add(tf.where(
        finite, tf.stack([tf.cast(norm, tf.float64), tf.constant(1.0, tf.float64)]),
        tf.zeros([2], tf.float64)))

  def reset(self):
    """Cross-replica context (eager or compiled): every replica's copy to zero."""
    for v in (self._sums, self._grad_norm):
      v.assign(tf.zeros_like(v))

  def totals(self):
    """Cross-replica context: the sums over all replicas, one float64 vector."""
    return tf.concat([self._sums.read_value(), self._grad_norm.read_value()], axis=0)

  def result(self, totals=None) -> dict:
    """Host sync: {"loss", each metric, "examples"[, "grad_norm"]} from `totals` (as a
    compiled loop returns them), or read now."""
    count, *sums = (self.totals() if totals is None else totals).numpy().tolist()
    *sums, norm_sum, norm_count = sums
    result = {name: total / max(count, 1.0) for name, total in zip(self._names, sums)}
    result["examples"] = int(round(count))
    if norm_count:
      result["grad_norm"] = norm_sum / norm_count
    return result


def _outputs(model, features, training: bool):
  """float32 outputs whatever the compute dtype (mixed precision computes in 16 bits)."""
  return tf.cast(model(features, training=training), tf.float32)


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
  def gradients(features, labels):
    with tf.GradientTape() as tape:
      outputs = _outputs(model, features, training=True)
      per_example_loss = metrics.per_example_loss(labels, outputs)
      loss = tf.nn.compute_average_loss(per_example_loss, global_batch_size=global_batch_size)
      if model.losses:
        loss += tf.nn.scale_regularization_loss(tf.add_n(model.losses))
      if loss_scale is not None:  # float16: keep small gradients from underflowing
        loss = loss_scale.scale_loss(loss)
    return tape.gradient(loss, variables), per_example_loss, outputs

  def replica_step(batch):
    features, labels = batch
    grads, per_example_loss, outputs = gradients(features, labels)
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
    metrics.update(per_example_loss, outputs, labels)

  return replica_step


def _state_finite(model, optimizer):
  """Whether every floating-point weight and optimizer slot is finite: a slot can
  overflow (Adam's second moment) while the loss and the weights still look fine."""
  variables = [v for v in model.variables + optimizer.variables
               if tf.as_dtype(v.dtype).is_floating]
  return tf.reduce_all([tf.reduce_all(tf.math.is_finite(v)) for v in variables])


def make_train_loop(strategy, model, optimizer, metrics: MetricSums, *,
                    global_batch_size: int, communication_options, loss_scale=None,
                    jit_compile: bool = False, clip_norm: float = 0.0):
  """Returns `train_loop(iterator, num_steps) -> (state_finite, metric totals)`: the
  metrics reset, `num_steps` steps and the metrics read, in one tf.function call."""
  replica_step = _make_replica_step(model, optimizer, metrics, global_batch_size=global_batch_size,
                                    communication_options=communication_options,
                                    loss_scale=loss_scale, jit_compile=jit_compile,
                                    clip_norm=clip_norm)

  @tf.function
  def train_loop(iterator, num_steps):
    """Runs `num_steps` steps; returns whether every weight and optimizer slot is still
    finite and the metric totals (on device, so the loop boundary reads both in one host sync)."""
    metrics.reset()
    for _ in tf.range(num_steps):
      strategy.run(replica_step, args=(next(iterator),))
    return _state_finite(model, optimizer), metrics.totals()

  return train_loop


def make_parameter_server_train_loop(coordinator, model, optimizer, metrics: MetricSums, *,
                                     global_batch_size: int, num_workers: int, loss_scale=None,
                                     jit_compile: bool = False, clip_norm: float = 0.0):
  """The same `train_loop(per_worker_iterator, num_steps) -> (state_finite, totals)`,
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
  def state_finite():
    return _state_finite(model, optimizer)

  def train_loop(per_worker_iterator, num_steps):
    metrics.reset()  # the variables live on the parameter servers
    num_steps = int(num_steps)
    pieces = min(num_steps, 2 * num_workers)  # enough to keep every worker busy
    for i in range(pieces):
      chunk = num_steps // pieces + (1 if i < num_steps % pieces else 0)
      coordinator.schedule(worker_steps, args=(per_worker_iterator, tf.constant(chunk)))
    coordinator.join()  # host sync: every scheduled step has run
    return state_finite(), metrics.totals()

  return train_loop


def make_eval_pass(strategy, model, metrics: MetricSums, dataset):
  """Returns `eval_pass()`: one pass over every example of `dataset`, a distributed
  dataset of `strategy`; with `strategy=None` a plain dataset evaluated right here
  (the parameter-server coordinator, reading the weights from the servers)."""

  def replica_step(batch):
    features, labels = batch
    outputs = _outputs(model, features, training=False)
    metrics.update(metrics.per_example_loss(labels, outputs), outputs, labels)

  @tf.function
  def eval_pass():
    for batch in dataset:
      if strategy is None:
        replica_step(batch)
      else:
        strategy.run(replica_step, args=(batch,))

  return eval_pass
