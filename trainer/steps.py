"""The compiled part of the loop: the replica step (any model, loss and metrics),
`steps_per_loop` of them per tf.function call, and the eval pass. Python never
runs between two steps.

Loss scaling: each replica sums its per-example losses and divides by the
*global* batch size (tf.nn.compute_average_loss), so the all-reduced SUM of the
replica gradients is exactly the gradient of the global-batch mean loss, for any
replica count.

Bookkeeping costs no variable traffic: each replica carries its running sums
(examples, loss, every metric, regularization, gradient norm) as a value of the
compiled loop and they are reduced once, when the loop ends, so the loop boundary
pays one host sync and the step writes nothing but the model and optimizer state.

With `jit_compile`, XLA compiles the whole step where the strategy allows it:
on a single replica, forward, backward, the (trivial) reduction, clipping and
the optimizer update are one XLA cluster; on several replicas, forward and
backward are one compiled piece per replica and the update one per device,
around the one explicit all-reduce (XLA cannot compile a merge_call).
"""
import tensorflow as tf

from trainer import optimizers


class Totals:
  """The layout of a loop's running sums:
  `[examples, loss, metric..., regularization, norm sum, norm steps]`.

  Sums, not means: divided once by the example count at the end, each metric
  is the exact mean over every example (any replica count, partial batches).
  The regularization term (model.losses: kernel regularizers, add_loss) is one
  value per step and replica (a weight penalty's is the same on every replica);
  each replica adds it times its own example count, so after the reduction and
  the division it is the average over the loop's steps (and replicas). A training
  loop's `loss` is the data loss plus it, as the gradient's is; eval reports the
  data loss alone.
  """

  def __init__(self, loss_fn, metric_fns: dict):
    self.loss_fn = loss_fn
    self._metric_fns = dict(metric_fns)
    self._names = ["loss", *self._metric_fns]
    self.size = len(self._names) + 4

  def zeros(self):
    return tf.zeros([self.size], tf.float64)

  def of_batch(self, per_example_loss, outputs, labels, norm=None, may_overflow=False,
               regularization=None):
    """The sums of one batch (its example count, loss, metrics and regularization) and of
    one step's gradient norm, as one vector: a handful of ops, since it runs every step.
    `may_overflow` (float16): a non-finite norm is left out of the average.
    `regularization`: the step's sum of model.losses (unscaled), if any."""
    values = [per_example_loss] + [fn(labels, outputs) for fn in self._metric_fns.values()]
    sums = [tf.reduce_sum(tf.cast(v, tf.float64)) for v in values]
    batch = per_example_loss.shape[0]  # static for training batches: no op
    count = (tf.constant(float(batch), tf.float64) if batch is not None
             else tf.cast(tf.shape(per_example_loss)[0], tf.float64))
    zero, one = tf.constant(0.0, tf.float64), tf.constant(1.0, tf.float64)
    regularization_sum = (zero if regularization is None
                          else tf.cast(regularization, tf.float64) * count)
    if norm is None:
      norm_pair = [zero, zero]
    elif may_overflow:
      finite = tf.math.is_finite(norm)
      norm_pair = [tf.where(finite, tf.cast(norm, tf.float64), zero), tf.where(finite, one, zero)]
    else:
      norm_pair = [tf.cast(norm, tf.float64), one]
    return tf.stack([count, *sums, regularization_sum, *norm_pair])

  def result(self, totals, *, training: bool = False) -> dict:
    """Host sync: {"loss", each metric, "examples"[, "grad_norm"]} from a loop's totals;
    `training` adds "regularization_loss", included in "loss"."""
    count, *sums = totals.numpy().tolist()
    *sums, regularization_sum, norm_sum, norm_count = sums
    result = {name: total / max(count, 1.0) for name, total in zip(self._names, sums)}
    if training:
      result["regularization_loss"] = regularization_sum / max(count, 1.0)
      result["loss"] += result["regularization_loss"]
    result["examples"] = int(round(count))
    if norm_count:
      result["grad_norm"] = norm_sum / norm_count
    return result


def _outputs(model, features, training: bool):
  """float32 outputs whatever the compute dtype (mixed precision computes in 16 bits)."""
  return tf.cast(model(features, training=training), tf.float32)


def _make_replica_step(model, optimizer, totals: Totals, *, global_batch_size: int,
                       communication_options, loss_scale=None, jit_compile: bool = False,
                       clip_norm: float = 0.0, decode=None, fuse_whole_step: bool = False):
  """`replica_step(batch, running) -> running`: one optimizer step on this replica's share
  of a global batch, its sums added to `running`.

  `decode` maps the features as the pipeline delivers them (e.g. uint8 images)
  to what the model takes, on the device. Clipping by global norm happens after
  the reduction, on the gradient of the global batch, identically on every
  replica. `fuse_whole_step` (a single replica, with jit_compile): the step is
  one XLA cluster.
  """
  variables = model.trainable_variables
  compile_pieces = jit_compile and not fuse_whole_step

  @tf.function(jit_compile=compile_pieces, autograph=False)
  def forward_backward(features, labels):
    if decode is not None:
      features = decode(features)
    with tf.GradientTape() as tape:
      outputs = _outputs(model, features, training=True)
      per_example_loss = totals.loss_fn(labels, outputs)
      loss = tf.nn.compute_average_loss(per_example_loss, global_batch_size=global_batch_size)
      regularization = None
      if model.losses:  # the whole model's term, once per step: 1/replicas of it per replica
        regularization = tf.cast(tf.add_n(model.losses), tf.float32)
        loss += tf.nn.scale_regularization_loss(regularization)
      if loss_scale is not None:  # float16: keep small gradients from underflowing
        loss = loss_scale.scale_loss(loss)
    return tape.gradient(loss, variables), per_example_loss, outputs, regularization

  def replica_step(batch, running):
    features, labels = batch
    grads, per_example_loss, outputs, regularization = forward_backward(features, labels)
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
    context.merge_call(
        lambda strategy_, grads_, finite_: optimizers.apply_reduced_gradients(
            strategy_, optimizer, grads_, variables, loss_scale=loss_scale, finite=finite_,
            jit_compile=compile_pieces, fused_kernels=not jit_compile),
        args=(reduced, finite))
    return running + totals.of_batch(per_example_loss, outputs, labels, norm,
                                     may_overflow=loss_scale is not None,
                                     regularization=regularization)

  if fuse_whole_step:
    return tf.function(replica_step, jit_compile=True, autograph=False)
  return replica_step


def _state_finite(model, optimizer):
  """Whether every floating-point weight and optimizer slot is finite: a slot can
  overflow (Adam's second moment) while the loss and the weights still look fine."""
  variables = [v for v in model.variables + optimizer.variables
               if tf.as_dtype(v.dtype).is_floating]
  return tf.reduce_all([tf.reduce_all(tf.math.is_finite(v)) for v in variables])


def make_train_loop(strategy, model, optimizer, totals: Totals, *,
                    global_batch_size: int, communication_options, loss_scale=None,
                    jit_compile: bool = False, clip_norm: float = 0.0, decode=None):
  """Returns `train_loop(iterator, num_steps) -> (state_finite, totals)`: `num_steps`
  steps and the sums of their batches, in one tf.function call."""
  replica_step = _make_replica_step(
      model, optimizer, totals, global_batch_size=global_batch_size,
      communication_options=communication_options, loss_scale=loss_scale,
      jit_compile=jit_compile, clip_norm=clip_norm, decode=decode,
      fuse_whole_step=jit_compile and strategy.num_replicas_in_sync == 1)

  @tf.function
  def train_loop(iterator, num_steps):
    """Runs `num_steps` steps; returns whether every weight and optimizer slot is still finite and the
    summed totals (on device, so the loop boundary reads both in one host sync)."""
    running = strategy.run(totals.zeros)
    for _ in tf.range(num_steps):
      running = strategy.run(replica_step, args=(next(iterator), running))
    return (_state_finite(model, optimizer),
            strategy.reduce(tf.distribute.ReduceOp.SUM, running, axis=None))

  return train_loop


def make_parameter_server_train_loop(coordinator, model, optimizer, totals: Totals, *,
                                     global_batch_size: int, num_workers: int, loss_scale=None,
                                     jit_compile: bool = False, clip_norm: float = 0.0,
                                     decode=None):
  """The same `train_loop(per_worker_iterator, num_steps) -> (state_finite, totals)`,
  asynchronous.

  The coordinator schedules the steps as a few closures of compiled steps; any
  free worker runs one, reading and updating the variables on the parameter
  servers, and returns the sums of its steps. `join()` returns when all have
  run -- a closure of a worker that died is run again elsewhere, so the job
  survives losing workers.
  """
  strategy = coordinator.strategy
  replica_step = _make_replica_step(model, optimizer, totals, global_batch_size=global_batch_size,
                                    communication_options=None, loss_scale=loss_scale,
                                    jit_compile=jit_compile, clip_norm=clip_norm, decode=decode)

  @tf.function
  def worker_steps(iterator, num_steps):
    running = totals.zeros()
    for _ in tf.range(num_steps):
      running = strategy.run(replica_step, args=(next(iterator), running))
    return running

  @tf.function
  def state_finite():
    return _state_finite(model, optimizer)

  def train_loop(per_worker_iterator, num_steps):
    num_steps = int(num_steps)
    pieces = min(num_steps, 2 * num_workers)  # enough to keep every worker busy
    sums = []
    for i in range(pieces):
      chunk = num_steps // pieces + (1 if i < num_steps % pieces else 0)
      sums.append(coordinator.schedule(worker_steps,
                                       args=(per_worker_iterator, tf.constant(chunk))))
    coordinator.join()  # host sync: every scheduled step has run
    return state_finite(), tf.add_n([remote.fetch() for remote in sums])

  return train_loop


def make_eval_pass(strategy, model, totals: Totals, dataset, decode=None):
  """Returns `eval_pass() -> totals`: one pass over every example of `dataset`, a
  distributed dataset of `strategy`; with `strategy=None` a plain dataset
  evaluated right here (the parameter-server coordinator, reading the weights
  from the servers)."""

  def add_batch(features, labels, running):
    if decode is not None:
      features = decode(features)
    outputs = _outputs(model, features, training=False)
    return running + totals.of_batch(totals.loss_fn(labels, outputs), outputs, labels)

  def replica_step(batch, running):
    # A replica's slice of the last batch may hold no example: the model is not called
    # on it (oneDNN's Conv->BatchNorm fails on an empty batch), it adds nothing.
    features, labels = batch
    size = tf.shape(tf.nest.flatten(labels)[0])[0]
    return tf.cond(size > 0, lambda: add_batch(features, labels, running), lambda: running)

  @tf.function
  def eval_pass():
    if strategy is None:
      running = totals.zeros()
      for batch in dataset:
        running = replica_step(batch, running)
      return running
    running = strategy.run(totals.zeros)
    for batch in dataset:
      running = strategy.run(replica_step, args=(batch, running))
    return strategy.reduce(tf.distribute.ReduceOp.SUM, running, axis=None)

  return eval_pass
