"""The compiled part of the loop: the task's replica step, `steps_per_loop` of them per
tf.function call, and the eval pass. Python never runs between two steps.

Bookkeeping costs no variable traffic: each replica carries its running sums (the
example count, every value the task's step returns, each update's gradient norm)
as a value of the compiled loop, and they are reduced once, when the loop ends, so
the loop boundary pays one host sync and the step writes nothing but the task's
state.

With `jit_compile` on a single replica of the default or one_device strategy the
whole step (the task's forward, backward and update) is one XLA cluster; elsewhere
(several replicas, or MirroredStrategy, which refuses a merge_call inside XLA on a
GPU even with one) the optimizer updates are compiled per device around the one
explicit all-reduce, and a task may compile its own pieces (the built-in
supervised task compiles its forward and backward).

A variable a replica assigns on its own (Keras 3's BatchNormalization moving
statistics: mirrored, aggregation NONE) drifts apart per replica, while a
checkpoint saves the first replica's copy. The loop ends with every replica
holding the first replica's value (`replicas_agree`), so what eval reports, what
is kept best and exported, and what the checkpoint holds are one set of
statistics; the first replica's values never depend on when that happens, so a
resumed run still equals an uninterrupted one.

What a step may return (per-example values or per-step scalars, no reserved name) is
checked in trainer/loop/step_values.py.
"""
import contextlib

import keras
import tensorflow as tf
from tensorflow.python.distribute import values as distribute_values  # pylint: disable=g-direct-tensorflow-import

from input_pipelines import autograph_scope
from trainer.cluster import runtime
from trainer.loop import step_values


class Sums:
  """The layout of a loop's running sums: `[examples, value..., (norm sum, norm steps)...,
  (the replica check of each scalar: sum, weighted sum, tolerance)...]`.

  Sums, not means: divided once by the example count at the end, each value is the
  exact mean over every example (any replica count, partial batches). A value
  the step returns per example ([batch]) is summed; a per-step scalar (a weight
  penalty, the same on every replica) is added times the replica's example
  count, so after the division it is the average over the loop's steps.

  A per-step scalar must be the same on every replica: one computed from the replica's
  share of the batch (a reduce_sum of its losses) would be averaged over the replicas
  and change with their count. With `checked` scalars (several replicas) each replica
  also keeps a fingerprint of the values it returned, and the loop compares the
  replicas' fingerprints once, when it ends (make_train_loop: `disagreeing`).
  """

  def __init__(self, names, norm_names=(), what: str = "train_step", checked=()):
    self.what = what  # the step, for messages
    self.names = list(names)
    self.norm_names = list(norm_names)
    self.checked = [name for name in self.names if name in checked]
    self._fingerprints_at = 1 + len(self.names) + 2 * len(self.norm_names)
    self.size = self._fingerprints_at + 3 * len(self.checked)

  def zeros(self):
    return tf.zeros([self.size], tf.float64)

  def of_batch(self, values: dict, count, norms: dict | None = None, step=None):
    """The sums of one batch: its example count, each value, each (norm, may_overflow)
    of `norms` (float16: a non-finite norm is left out of the average), and each
    checked scalar's fingerprint at `step`."""
    sums = []
    for name in self.names:
      value = tf.cast(values[name], tf.float64)
      sums.append(value * count if value.shape.rank == 0 else
                  tf.reduce_sum(step_values.per_example(self.what, name, value, count)))
    zero, one = tf.constant(0.0, tf.float64), tf.constant(1.0, tf.float64)
    counts_norms = _counts_norms()
    for name in self.norm_names:
      if not counts_norms:
        sums += [zero, zero]
        continue
      norm, may_overflow = norms[name]
      norm = tf.cast(norm, tf.float64)
      if may_overflow:
        finite = tf.math.is_finite(norm)
        sums += [tf.where(finite, norm, zero), tf.where(finite, one, zero)]
      else:
        sums += [norm, one]
    for name in self.checked:
      sums += _fingerprint(values[name], step)
    return tf.stack([count, *sums])

  def reduce_checked(self, gathered):
    """In the compiled loop, from every replica's running sums `gathered` ([replicas,
    size]): their sum, then one flag per checked scalar (1: the replicas returned
    different values in some step of the loop)."""
    fingerprints = tf.reshape(gathered[:, self._fingerprints_at:], [-1, len(self.checked), 3])
    spread = tf.reduce_max(fingerprints, axis=0) - tf.reduce_min(fingerprints, axis=0)
    tolerance = tf.reduce_max(fingerprints[:, :, 2], axis=0)
    # Each step's weight is below 2: values within the tolerance differ by at most twice it.
    # NaN (a non-finite value) compares false: the rollback reports it.
    differ = (spread[:, 0] > tolerance) | (spread[:, 1] > 2.0 * tolerance)
    return tf.concat([tf.reduce_sum(gathered, axis=0), tf.cast(differ, tf.float64)], axis=0)

  def disagreeing(self, totals) -> list:
    """The checked scalars whose replicas disagreed (reduce_checked's flags)."""
    if not self.checked:
      return []
    flags = totals.numpy().tolist()[self.size:]
    return [name for name, flag in zip(self.checked, flags) if flag]

  def result(self, totals) -> dict:
    """Host sync: {each value, "examples", each norm} from a loop's totals."""
    count, *sums = totals.numpy().tolist()
    result = {name: total / max(count, 1.0) for name, total in zip(self.names, sums)}
    result["examples"] = int(round(count))
    norm_sums = sums[len(self.names):]
    for i, name in enumerate(self.norm_names):
      total, steps = norm_sums[2 * i], norm_sums[2 * i + 1]
      if steps:
        result[name] = total / steps
    return result


_GOLDEN = 0.6180339887498949
_ULP = {tf.float16: 2.0**-10, tf.bfloat16: 2.0**-7, tf.float32: 2.0**-23, tf.float64: 2.0**-52}


def _fingerprint(value, step) -> list:
  """[value, value * w(step), tolerance * |value|] of a per-step scalar, summed over a loop:
  replicas that returned the same values in every step hold the same sums. The weight
  w in [1, 2), the same on every replica, keeps differences from cancelling over steps
  (30 then 28 on one replica, 28 then 30 on the other). The tolerance: 8 units in the
  last place of the value's dtype (a float reduced on each device may round apart);
  none for an integer."""
  value = tf.convert_to_tensor(value)  # a Python number: a constant, the same everywhere
  tolerance = 8.0 * _ULP.get(value.dtype, 0.0)
  value = tf.cast(value, tf.float64)
  weight = 1.0 + tf.math.floormod(tf.cast(step, tf.float64) * _GOLDEN, 1.0)
  return [value, value * weight, tolerance * tf.abs(value)]


def _counts_norms() -> bool:
  """Whether this replica adds the gradient norms to the sums. Every replica holds the same
  reduced gradients, so one replica's norm is the norm: the other replicas add nothing,
  and TensorFlow prunes their unused norm ops from the step (unless the task uses the
  returned norm). Where the replica id is not known at trace time, every replica adds
  its copy, and the average is the same."""
  context = tf.distribute.get_replica_context()
  if context is None:
    return True
  replica = tf.get_static_value(context.replica_id_in_sync_group)
  return replica is None or int(replica) == 0


def _example_count(batch):
  """The replica's example count, as float64: static for training batches (no op)."""
  first = tf.nest.flatten(batch)[0]
  size = first.shape[0]
  return (tf.constant(float(size), tf.float64) if size is not None
          else tf.cast(tf.shape(first)[0], tf.float64))


def discover(step_fn, batch_spec, what: str, strategy=None, check=None,
             lengths_must_be_static: bool = False) -> tuple[list, dict, list]:
  """(the names the step returns, in order; the context's gradient norms by name; the
  names of its per-step scalars), by
  tracing `step_fn(batch) -> (values, norms)` once in a throwaway graph: nothing runs.
  With a `strategy` it is traced in a replica context, as it will run; a static batch
  size in `batch_spec` checks the per-example values' lengths here (`lengths_must_be_static`: see
  step_values.check_values). `check(what, trace)` traces it instead (TaskState.check_step: the trace
  is checked against the task's checkpointed state)."""
  found = {}

  def replica_probe(batch):
    values, norms = step_fn(batch)
    _, labels = batch
    found["values"] = step_values.check_values(
        what, values, tf.nest.flatten(labels)[0].shape[0], lengths_must_be_static)
    found["norms"] = norms
    return tf.constant(0)

  def probe(batch):
    if strategy is None:
      return replica_probe(batch)
    return strategy.run(replica_probe, args=(batch,))

  def trace():
    return tf.function(probe, autograph=True).get_concrete_function(batch_spec)

  if check is None:
    trace()
  else:
    check(what, trace)
  values = found["values"]
  scalars = [name for name, value in values.items()
             if tf.convert_to_tensor(value).shape.rank == 0]
  return list(values), dict(found["norms"]), scalars


def state_finite(variables):
  """Whether every floating-point variable of the task's state is finite: a slot can
  overflow (Adam's second moment) while the loss and the weights still look fine."""
  variables = [v for v in variables if tf.as_dtype(v.dtype).is_floating]
  return tf.reduce_all([tf.reduce_all(tf.math.is_finite(v)) for v in variables])


def make_replica_step(task, sums: Sums, step_context, decode=None, fuse_whole_step=False):
  """`replica_step(batch, running, step) -> running`: the task's step on this replica's
  share of a global batch, its sums added to `running`. `step_context(step)` makes the
  StepContext; `decode` maps the features as the pipeline delivers them (uint8
  images) to what the model takes, on the device."""

  def replica_step(batch, running, step):
    features, labels = batch
    if decode is not None:
      features = decode(features)
    context = step_context(step)
    values = context.call(autograph_scope.user_function(task.train_step), (features, labels))
    return running + sums.of_batch(values, _example_count(labels), context.gradient_norms,
                                   step)

  if fuse_whole_step:
    return tf.function(replica_step, jit_compile=True)
  return replica_step


def replica_local(variables) -> list:
  """Of the task's model and extra `variables`, those each replica updates on its own
  (mirrored, aggregation NONE, not trained: assigned in a replica context, only that
  replica's copy changes). Trained ones get the same reduced gradients everywhere."""
  found = []
  for variable in variables:
    if isinstance(variable, keras.Variable):
      variable = variable.value
    if (isinstance(variable, distribute_values.MirroredVariable)
        and variable.aggregation == tf.VariableAggregation.NONE and not variable.trainable
        and variable.dtype.is_floating):  # an integer (a seed's counter) advances alike
      found.append(variable)
  return found


@contextlib.contextmanager
def one_copy_takes_the_first_replicas(strategy):
  """Inside strategy.scope(), while the task builds: under CentralStorageStrategy on
  several devices, a variable each replica would assign on its own (aggregation NONE, not
  trained: Dropout's seed state, BatchNormalization's moving statistics) takes the first
  replica's assignment instead. Its one copy on the CPU cannot take an unaggregated
  assignment from a replica (TensorFlow refuses the step), and the first replica's value
  is what MirroredStrategy keeps too (replicas_agree): central_storage trains like
  mirrored."""
  if not (isinstance(strategy, tf.distribute.experimental.CentralStorageStrategy)
          and strategy.num_replicas_in_sync > 1):
    yield
    return

  def creator(next_creator, **kwargs):
    if (kwargs.get("aggregation") in (tf.VariableAggregation.NONE, "none")
        and kwargs.get("trainable") is False):
      kwargs["aggregation"] = tf.VariableAggregation.ONLY_FIRST_REPLICA
    return next_creator(**kwargs)

  with tf.variable_creator_scope(creator):
    yield


def replicas_agree(variables) -> None:
  """In a replica context: every replica's copy of `variables` (replica_local) becomes
  the first replica's (the copy a checkpoint saves), in one batched all-reduce: the
  others add zeros, so the sum is that copy exactly."""
  context = tf.distribute.get_replica_context()
  first = tf.equal(context.replica_id_in_sync_group, 0)
  by_dtype = {}
  for variable in variables:  # a batched all-reduce packs tensors of one dtype together
    by_dtype.setdefault(variable.dtype, []).append(variable)
  for group in by_dtype.values():
    values = [tf.convert_to_tensor(variable) for variable in group]
    agreed = context.all_reduce(tf.distribute.ReduceOp.SUM,
                                [tf.where(first, value, tf.zeros_like(value)) for value in values])
    for variable, value in zip(group, agreed):
      variable.assign(value)


def make_train_loop(strategy, replica_step, sums: Sums, variables, model_variables,
                    learning_rates):
  """Returns `train_loop(iterator, num_steps, first_step) -> (state_finite, totals,
  learning rates)`: `num_steps` steps and the sums of their batches, in one tf.function
  call; then the replicas agree on the `model_variables` each updates on its own (module
  docstring). `learning_rates()` (the next step's rates, a float64 vector) is read in the
  same call: a call of its own cost a tiny model a tenth of its time. With scalars to
  check (`sums.checked`), the replicas' sums are gathered instead of all-reduced (one
  collective still) and the totals end with the flags of Sums.reduce_checked."""
  local = replica_local(model_variables) if strategy.num_replicas_in_sync > 1 else []

  @tf.function
  def train_loop(iterator, num_steps, first_step):
    """Runs `num_steps` steps; returns whether every variable of the state is still
    finite, the summed totals and the next learning rates (on device: the boundary reads
    them in one sync)."""
    running = strategy.run(sums.zeros)
    for i in tf.range(num_steps):
      step = first_step + tf.cast(i, tf.int64)
      running = strategy.run(replica_step, args=(next(iterator), running, step))
    if local:
      strategy.run(lambda: replicas_agree(local))
    if sums.checked:
      totals = sums.reduce_checked(_every_replicas(strategy, running))
    else:
      totals = strategy.reduce(tf.distribute.ReduceOp.SUM, running, axis=None)
    return state_finite(variables), totals, learning_rates()

  return train_loop


def _every_replicas(strategy, running):
  """[replicas, size]: each replica's `running`, in replica order, in the cross-replica
  context. One process holds them all: stacked from its devices (two CPU devices: 0.14 ms,
  the SUM reduce 0.11 ms, strategy.gather 0.51 ms); several workers: gathered."""
  if runtime.num_workers(strategy) == 1:
    return tf.stack(strategy.experimental_local_results(running))
  return strategy.gather(strategy.run(lambda sums_: sums_[None], args=(running,)), axis=0)


def make_parameter_server_train_loop(coordinator, replica_step, sums: Sums, variables,
                                     num_workers: int, learning_rates):
  """The same `train_loop(per_worker_iterator, num_steps, first_step)`, asynchronous.

  The coordinator schedules the steps as a few closures of compiled steps; any
  free worker runs one, reading and updating the variables on the parameter
  servers, and returns the sums of its steps. `join()` returns when all have
  run -- a closure of a worker that died is run again elsewhere, so the job
  survives losing workers.
  """
  strategy = coordinator.strategy

  @tf.function
  def worker_steps(iterator, num_steps, first_step):
    running = sums.zeros()
    for i in tf.range(num_steps):
      step = first_step + tf.cast(i, tf.int64)
      running = strategy.run(replica_step, args=(next(iterator), running, step))
    return running

  @tf.function
  def finite_and_learning_rates():
    return state_finite(variables), learning_rates()

  def train_loop(per_worker_iterator, num_steps, first_step):
    num_steps, first_step = int(num_steps), int(first_step)
    pieces = min(num_steps, 2 * num_workers)  # enough to keep every worker busy
    results, start = [], first_step
    for i in range(pieces):
      chunk = num_steps // pieces + (1 if i < num_steps % pieces else 0)
      results.append(coordinator.schedule(worker_steps, args=(
          per_worker_iterator, tf.constant(chunk), tf.constant(start, tf.int64))))
      start += chunk
    coordinator.join()  # host sync: every scheduled step has run
    finite, rates = finite_and_learning_rates()
    return finite, tf.add_n([remote.fetch() for remote in results]), rates

  return train_loop


def make_eval_pass(strategy, task, sums: Sums, dataset, decode=None):
  """Returns `eval_pass() -> totals`: one pass over every example of `dataset`, a
  distributed dataset of `strategy`; with `strategy=None` a plain dataset
  evaluated right here (the parameter-server coordinator, reading the weights
  from the servers)."""

  def add_batch(features, labels, running):
    if decode is not None:
      features = decode(features)
    values = autograph_scope.user_function(task.eval_step)((features, labels))
    return running + sums.of_batch(values, _example_count(labels))

  def replica_step(batch, running):
    # A replica's slice of the last batch may hold no example: the task is not called
    # on it (oneDNN's Conv->BatchNorm fails on an empty batch), it adds nothing.
    features, labels = batch
    size = tf.shape(tf.nest.flatten(labels)[0])[0]
    return tf.cond(size > 0, lambda: add_batch(features, labels, running), lambda: running)

  @tf.function
  def eval_pass():
    if strategy is None:
      running = sums.zeros()
      for batch in dataset:
        running = replica_step(batch, running)
      return running
    running = strategy.run(sums.zeros)
    for batch in dataset:
      running = strategy.run(replica_step, args=(batch, running))
    return strategy.reduce(tf.distribute.ReduceOp.SUM, running, axis=None)

  return eval_pass
