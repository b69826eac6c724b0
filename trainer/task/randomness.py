"""Keras's random layers drawn per example: the same numbers for the same example on any
replica count (under `runtime.deterministic`).

Keras draws a random layer's numbers (Dropout's mask, GaussianNoise, RandomFlip's and
RandomRotation's per-image choices, a layer's own `keras.random.*` with a
SeedGenerator) from a seed that is the same on every replica, over the shape of the
replica's own share: replica 1 of 2 then reuses the numbers replica 0 drew, and an
example's mask depends on the replica count (measured on the built-in `mlp`, Dropout
0.2: 2.4e-2 after 20 steps, 1 vs 2 replicas). Inside a train step, `per_example`
makes every Keras draw whose first dimension is the replica's batch draw the *global*
batch's numbers instead and keep this replica's rows, the way JAX's global arrays and
`StepContext.normal` do: the rows example i gets are the same on 1, 2 or 3 replicas, bit
for bit, and on one replica nothing changes. Draws of any other shape (RandomCrop's one
offset per batch) are the same on every replica already. Cost: each replica draws the
global batch's numbers, N times its own (docs/performance.md).

trainer/analysis/replica_dependence.py names the random ops of a traced step that were not drawn this
way (a `tf.random.Generator`, `StepContext.seed()`, `keras.random.shuffle`): an elastic
resume of such a Task is refused (trainer/state/elastic.py).
"""
import contextlib
import threading

import tensorflow as tf

# Draws distloop knows to be per replica carry this in their ops' names (the step's graph
# is checked: trainer/analysis/replica_dependence.py); a draw with a state (the kernel's, or
# a Generator's variable) is per replica whatever its name.
PER_REPLICA_SCOPE = "distloop_per_replica"

PER_REPLICA = "per_replica"  # _rows_of_global: a draw per replica (another layout, micro-batches)
_active = threading.local()  # MirroredStrategy traces each replica in a thread of its own
_installed = False


@contextlib.contextmanager
def per_example(global_batch_size: int, num_replicas: int):
  """While a replica's train step is traced: Keras draws over the replica's batch are
  the global batch's rows (module docstring)."""
  _install()
  before = getattr(_active, "batch", None)
  _active.batch = (global_batch_size, num_replicas)
  try:
    yield
  finally:
    _active.batch = before


@contextlib.contextmanager
def drawn_per_replica():
  """Inside `per_example`: draws over a part of the replica's batch (train.accumulation_steps'
  micro-batches, each drawn with the seed's next value) are not per example; left as Keras
  draws them, they count as randomness that depends on the replica count."""
  before = getattr(_active, "batch", None)
  _active.batch = PER_REPLICA if before is not None else None
  try:
    yield
  finally:
    _active.batch = before


@contextlib.contextmanager
def seeded_per_replica():
  """Marks StepContext.seed()'s ops: what is drawn from it differs on each replica."""
  with tf.name_scope(PER_REPLICA_SCOPE):
    yield


# -- the draws ---------------------------------------------------------------------


def _rows_of_global(shape):
  """How a draw of `shape` inside `per_example` is made: (the global batch's shape, this
  replica's first row, its row count) if its first dimension is this replica's batch;
  None if no dimension is (one number per batch, RandomCrop's offset: the same on every
  replica, and on 1); PER_REPLICA if the batch shows elsewhere (a multiple of it first:
  two views of each example; or a later dimension: a time-major [T, B, D]): per example,
  but not in a layout distloop can slice, so left as Keras draws it and counted as
  randomness that depends on the replica count."""
  if _active.batch is PER_REPLICA:  # drawn_per_replica
    return PER_REPLICA
  global_batch, num_replicas = _active.batch
  context = tf.distribute.get_replica_context()
  dims = _dims(shape)
  if context is None or not dims:  # a cross-replica context: not one replica's share
    return None
  rows = global_batch // num_replicas
  static = [tf.get_static_value(dim) for dim in dims]
  leading = static[0]
  if leading is None or int(leading) == rows:
    replica = context.replica_id_in_sync_group
    return [global_batch, *dims[1:]], tf.cast(replica, tf.int32) * rows, rows
  if int(leading) % rows == 0 or any(dim is not None and int(dim) == rows
                                     for dim in static[1:]):
    return PER_REPLICA
  return None


def _dims(shape) -> list:
  if isinstance(shape, tf.TensorShape):
    return shape.as_list() if shape.rank is not None else []
  if isinstance(shape, (list, tuple)):
    return list(shape)
  shape = tf.convert_to_tensor(shape)
  if shape.shape.rank != 1 or shape.shape[0] is None:
    return []
  # Dropout's noise shape is tf.shape(inputs): known as a whole when the inputs' shape is,
  # though each element sliced from it is not (a [2 x batch, ...] input is no batch).
  known = tf.get_static_value(shape)
  if known is not None:
    return [int(value) for value in known]
  return [shape[i] for i in range(shape.shape[0])]


def _shaped(original):
  """normal, uniform, truncated_normal, randint: (shape, ...) drawn per example."""

  def draw(shape, *args, **kwargs):
    if getattr(_active, "batch", None) is None:
      return original(shape, *args, **kwargs)
    found = _rows_of_global(shape)
    if found is PER_REPLICA:
      with tf.name_scope(PER_REPLICA_SCOPE):
        return original(shape, *args, **kwargs)
    if found is None:
      return original(shape, *args, **kwargs)
    global_shape, first, rows = found
    return original(global_shape, *args, **kwargs)[first:first + rows]

  draw.__wrapped__ = original
  return draw


def _per_replica(original):
  """shuffle (MixUp's and CutMix's partners: within the replica's share), categorical,
  gamma, binomial, beta: not drawn per example, named as randomness per replica."""

  def draw(*args, **kwargs):
    if getattr(_active, "batch", None) is None:
      return original(*args, **kwargs)
    with tf.name_scope(PER_REPLICA_SCOPE):
      return original(*args, **kwargs)

  draw.__wrapped__ = original
  return draw


def _dropout(original, backend_random):
  """Keras's dropout (tf.nn.experimental.stateless_dropout, bit for bit on one replica),
  its keep mask drawn over the global batch."""

  def dropout(inputs, rate, noise_shape=None, seed=None):
    if (getattr(_active, "batch", None) is None
        or isinstance(rate, (int, float)) and rate in (0.0, 1.0)):
      return original(inputs, rate, noise_shape, seed)
    inputs = tf.convert_to_tensor(inputs)
    noise = backend_random._get_concrete_noise_shape(inputs, noise_shape)  # pylint: disable=protected-access
    found = _rows_of_global(noise)
    if found is PER_REPLICA:
      with tf.name_scope(PER_REPLICA_SCOPE):
        return original(inputs, rate, noise_shape, seed)
    if found is None:
      return original(inputs, rate, noise_shape, seed)
    global_shape, first, rows = found
    seed = backend_random._cast_seed(backend_random.draw_seed(seed))  # pylint: disable=protected-access
    drawn = tf.random.stateless_uniform(global_shape, seed=seed, dtype=inputs.dtype)
    keep = drawn[first:first + rows] >= tf.cast(rate, inputs.dtype)
    # As stateless_dropout computes it: x * (1 / keep_prob), zero where dropped.
    scaled = inputs * tf.cast(1 / (1 - rate), inputs.dtype)
    return tf.where(keep, scaled, tf.zeros([], inputs.dtype))

  dropout.__wrapped__ = original
  return dropout


def _install() -> None:
  """Wraps the TensorFlow backend's random functions once (they act only inside
  `per_example`; everywhere else they call Keras's own)."""
  global _installed
  if _installed:
    return
  from keras.src.backend.tensorflow import random as backend_random  # pylint: disable=g-import-not-at-top
  for name in ("normal", "uniform", "truncated_normal", "randint"):
    setattr(backend_random, name, _shaped(getattr(backend_random, name)))
  backend_random.dropout = _dropout(backend_random.dropout, backend_random)
  for name in ("shuffle", "categorical", "gamma", "binomial", "beta"):
    setattr(backend_random, name, _per_replica(getattr(backend_random, name)))
  _installed = True
