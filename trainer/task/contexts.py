"""What a Task is handed: `BuildContext` in build(), `StepContext` in train_step().

The StepContext is where distloop keeps its guarantees inside a user's step:
the loss is divided by the global batch (`replica_loss`), each gradient is
all-reduced once and applied in a cross-replica context (`apply_gradients`,
`minimize`), float16 losses are scaled per optimizer, and the step's randomness
is a stateless function of (runtime.seed, step) (`normal`, `uniform`, `example_seeds`,
`seed`), and `all_gather` joins the replicas' shares of the global batch in order.
"""
import tensorflow as tf

from trainer.cluster import sharding
from trainer.task import optimizers
from trainer.task import randomness
from trainer.task import sparse_gradients
from trainer.errors import UserError


class BuildContext:
  """`config`: the run's config; `features_spec` / `labels_spec`: TensorSpecs of a
  batch (batch dimension None); `probe`: a few real training examples (features,
  labels), eager; `strategy`: build() already runs in its scope."""

  def __init__(self, config, features_spec, labels_spec, probe, strategy, load_weights,
               learning_rate_factor=None):
    self.config = config
    # The run's learning rate factor (trainer/loop/learning_rate.py), or None: off.
    self._learning_rate_factor = learning_rate_factor
    self.factored_optimizers = 0  # how many optimizer() made on it
    self._load_weights = load_weights  # trainer/state/task_state.py: load_model_weights
    self.features_spec = features_spec
    self.labels_spec = labels_spec
    self.probe = probe
    self.strategy = strategy

  def optimizer(self, variables=None):
    """The optimizer of train.optimizer / learning_rate / lr_schedule, built for
    `variables` when given."""
    optimizer = optimizers.create(self.config.train, self._learning_rate_factor)
    self.factored_optimizers += self._learning_rate_factor is not None
    if variables is not None:
      optimizer.build(variables)
    return optimizer

  def load_weights(self, model, path: str) -> None:
    """`model`'s weights from the newest checkpoint of a distloop model_dir (or its
    checkpoints/ or one checkpoints/<step>/) written by a model of the same layers:
    a frozen teacher, a pretrained encoder. UserError if they do not match."""
    self._load_weights(model, path)


class StepContext:
  """Handed to train_step, once per trace. `step`: the 0-based number of the step being
  taken (an int64 tensor); `global_batch_size`; `num_replicas`."""

  def __init__(self, *, step, global_batch_size: int, num_replicas: int, seed: int,
               loss_scales: dict, clip_norm: float = 0.0, communication_options=None,
               jit_compile: bool = False, fused_kernels: bool = True, tracing_only: bool = False,
               per_example_randomness: bool = False):
    self.step = step
    self.global_batch_size = global_batch_size
    self.num_replicas = num_replicas
    self.jit_compile = jit_compile
    self._seed = seed
    self._loss_scales = loss_scales  # id(optimizer) -> DynamicLossScale (float16) or None
    self._clip_norm = clip_norm
    self._communication_options = communication_options
    self._fused_kernels = fused_kernels
    self._tracing_only = tracing_only  # discovering the step's outputs: nothing is applied
    self.gradient_norms = {}  # name -> (norm, may_overflow), one per apply_gradients
    # runtime.deterministic: Keras's random layers draw per example (trainer/task/randomness.py).
    self.per_example_randomness = per_example_randomness

  def call(self, train_step, batch):
    """`train_step(batch, self)`, its Keras random draws per example when asked."""
    if not self.per_example_randomness:
      return train_step(batch, self)
    with randomness.per_example(self.global_batch_size, self.num_replicas):
      return train_step(batch, self)

  # -- the loss and the update ----------------------------------------------------

  def replica_loss(self, per_example_loss, regularization=None):
    """This replica's share of the global-batch mean loss: sum(per_example_loss) /
    global_batch_size (+ regularization / num_replicas, a per-step term such as
    sum(model.losses)). Differentiate it: the SUM over replicas of its gradients is
    the gradient of the global mean, for any replica count."""
    per_example_loss = tf.cast(per_example_loss, tf.float32)  # mixed precision: sum in 32 bits
    loss = tf.nn.compute_average_loss(per_example_loss, global_batch_size=self.global_batch_size)
    if regularization is not None:
      loss += tf.nn.scale_regularization_loss(tf.cast(regularization, loss.dtype))
    return loss

  def gradients(self, optimizer, tape, loss, variables):
    """tape.gradient(loss, variables), with `optimizer`'s float16 loss scale applied
    (apply_gradients takes it off after the reduction)."""
    scale = self._loss_scales.get(id(optimizer))
    output_gradients = None if scale is None else tf.cast(scale.scale, loss.dtype)
    # A sharded variable (runtime.variable_partitioner): its shards' gradients, joined.
    variables = list(variables)
    gradients = tape.gradient(loss, sharding.gradient_sources(variables),
                              output_gradients=output_gradients)
    return sharding.join_gradients(variables, gradients)

  def apply_gradients(self, optimizer, gradients, variables, name: str | None = None):
    """One update of `variables` by `optimizer` from this replica's gradients: summed
    over replicas once, unscaled (float16; a step that overflowed is skipped and
    the scale shrinks), clipped to train.clip_grad_norm, applied. Returns the global
    norm of the reduced gradients (before clipping), reported as `gradient_norm`
    (`<name>_gradient_norm` for a named update)."""
    variables, gradients = list(variables), list(gradients)
    label = f"{name}_gradient_norm" if name else "gradient_norm"
    if label in self.gradient_norms:
      raise UserError(f"two apply_gradients in one train_step both report {label}; pass "
                      f"name= to tell them apart")
    _check_gradients(optimizer, gradients, variables)
    if self._tracing_only:
      self.gradient_norms[label] = (tf.constant(0.0), False)
      return tf.constant(0.0)
    scale = self._loss_scales.get(id(optimizer))
    context = tf.distribute.get_replica_context()
    # The one and only gradient reduction (see trainer/task/optimizers.py for why).
    reduced = _all_sum(context, gradients, self._communication_options)
    finite = None
    if scale is not None:  # the same reduced gradients, so the same verdict, everywhere
      reduced, finite = scale.unscale(reduced)
    if self._clip_norm > 0:
      reduced, norm = tf.clip_by_global_norm(reduced, self._clip_norm)  # norm: before clipping
    else:
      norm = tf.linalg.global_norm(reduced)
    context.merge_call(
        lambda strategy_, grads_, finite_: optimizers.apply_reduced_gradients(
            strategy_, optimizer, grads_, variables, loss_scale=scale, finite=finite_,
            jit_compile=self.jit_compile, fused_kernels=self._fused_kernels),
        args=(reduced, finite))
    self.gradient_norms[label] = (norm, scale is not None)
    return norm

  def minimize(self, optimizer, tape, loss, variables, name: str | None = None):
    """gradients() then apply_gradients(): `loss` from replica_loss(), recorded by `tape`."""
    variables = list(variables)
    return self.apply_gradients(optimizer, self.gradients(optimizer, tape, loss, variables),
                                variables, name=name)

  # -- across replicas ---------------------------------------------------------------

  def all_gather(self, value, axis: int = 0):
    """`value` of every replica, concatenated along `axis` in replica order: with
    axis=0 a per-example value of the whole global batch, in the global batch's order,
    the same for any replica count (a contrastive loss's global negatives). Gradients
    flow back to this replica's share."""
    context = tf.distribute.get_replica_context()
    if context is None or context.num_replicas_in_sync == 1:
      return tf.convert_to_tensor(value)
    return context.all_gather(value, axis)

  # -- randomness that a resumed run draws again ------------------------------------

  def example_seeds(self, salt: int = 0):
    """One stateless seed per example ([this replica's examples, 2] int64), a function of
    (runtime.seed, salt, step, the example's place in the global batch): an example's
    augmentation is the same for 1, 2 or 3 replicas and in a resumed run. Map it over
    the examples with their seed, e.g. tf.map_fn over (images, seeds) with
    tf.image.stateless_random_flip_left_right(image, seed)."""
    return self._rows(tf.random.stateless_uniform(
        [self.global_batch_size, 2], self._step_seed(salt), minval=None, maxval=None,
        dtype=tf.int64))

  def seed(self, salt: int = 0):
    """A stateless seed ([2] int64) of (runtime.seed, salt, step, replica): one per replica
    and step, for tf.random.stateless_* ops drawn over a replica's whole share. Its
    numbers change with the replica count (replica 0 of 2 holds other examples than
    replica 0 of 1): `normal`, `uniform` and `example_seeds` do not."""
    replica = tf.distribute.get_replica_context().replica_id_in_sync_group
    with randomness.seeded_per_replica():
      return tf.random.experimental.stateless_fold_in(self._step_seed(salt), replica)

  def micro_batch(self):
    """A context for one micro-batch of a step that accumulates gradients: Keras's random
    layers inside it draw as Keras does (per replica: a micro-batch is not the replica's
    batch, so no per-example draw fits it), and an elastic resume names them."""
    return randomness.drawn_per_replica()

  def normal(self, shape, dtype=tf.float32, salt: int = 0):
    """Standard-normal noise [this replica's examples, *shape]: the rows of the global
    batch's draw this replica holds, so the global batch's noise is the same for any
    replica count (a GAN's samples, a diffusion model's noise)."""
    return self._rows(tf.random.stateless_normal(
        [self.global_batch_size, *shape], self._step_seed(salt), dtype=dtype))

  def uniform(self, shape, dtype=tf.float32, salt: int = 0, minval=0, maxval=1):
    """Uniform noise, as `normal`."""
    return self._rows(tf.random.stateless_uniform(
        [self.global_batch_size, *shape], self._step_seed(salt), minval=minval,
        maxval=maxval, dtype=dtype))

  def _step_seed(self, salt: int):
    base = tf.constant([self._seed, salt], tf.int64)
    return tf.random.experimental.stateless_fold_in(base, tf.cast(self.step, tf.int64))

  def _rows(self, values):
    rows = self.global_batch_size // self.num_replicas
    if self.num_replicas == 1:
      return values
    replica = tf.distribute.get_replica_context().replica_id_in_sync_group
    return values[replica * rows:(replica + 1) * rows]


def _all_sum(context, gradients, options) -> list:
  """The SUM over replicas of each gradient, in one all-reduce (packed as `options` say),
  a sparse one (IndexedSlices) then with its repeated rows summed (its norm is then the
  gradient's: sparse_gradients.py). A sparse gradient whose row count is not static is
  made dense for the all-reduce: its count follows each replica's padded length, and a
  collective whose shape varies by step aborted inside the compiled loop (TF 2.21). Dense
  is exact and costs the table's size; a static count is the same everywhere and stays
  sparse."""
  if context.num_replicas_in_sync > 1:
    gradients = context.all_reduce(
        tf.distribute.ReduceOp.SUM,
        [tf.convert_to_tensor(gradient)
         if isinstance(gradient, tf.IndexedSlices) and gradient.indices.shape[0] is None
         else gradient for gradient in gradients], options=options)
  return [sparse_gradients.deduplicated(gradient)
          if isinstance(gradient, tf.IndexedSlices) else gradient for gradient in gradients]


def _check_gradients(optimizer, gradients, variables) -> None:
  """At trace time, in words: a variable with no gradient, or one the optimizer was not
  built for (its slots would have to be created inside the compiled step)."""
  if len(gradients) != len(variables):
    raise UserError(f"apply_gradients got {len(gradients)} gradients for {len(variables)} "
                    f"variables")
  for gradient, variable in zip(gradients, variables):
    if gradient is None:
      raise UserError(f"no gradient for {variable.path}: the loss does not depend on it; "
                      f"leave it out of the variables passed to minimize/apply_gradients")
    try:
      optimizer._get_variable_index(variable)  # pylint: disable=protected-access
    except (KeyError, AttributeError, ValueError):
      raise UserError(f"optimizer {optimizer.name!r} was not built for {variable.path}: "
                      f"call optimizer.build(variables) in Task.build") from None


class PredictContext:
  """Handed to predict_step, once per trace. `rows`: the batch's examples' indices in
  the source (int64 [this replica's examples]). Its randomness is a function of
  (runtime.seed, salt, the row), never of the batch, the replica count or the process:
  a row's samples are the same in a rerun after a kill and on any shape."""

  def __init__(self, *, rows, seed: int):
    self.rows = rows
    self._seed = seed

  def example_seeds(self, salt: int = 0):
    """One stateless seed per row ([examples, 2] int64) of (runtime.seed, salt, row)."""
    base = tf.constant([self._seed, salt], tf.int64)
    return tf.stack([tf.fill(tf.shape(self.rows), base[0] * 1_000_003 + base[1]), self.rows],
                    axis=1)

  def normal(self, shape, dtype=tf.float32, salt: int = 0):
    """Standard-normal noise [examples, *shape], each row's drawn from its own seed."""
    return self._per_row(lambda seed: tf.random.stateless_normal(shape, seed, dtype=dtype),
                         salt, dtype)

  def uniform(self, shape, dtype=tf.float32, salt: int = 0, minval=0, maxval=1):
    """Uniform noise [examples, *shape], as `normal`."""
    return self._per_row(lambda seed: tf.random.stateless_uniform(
        shape, seed, minval=minval, maxval=maxval, dtype=dtype), salt, dtype)

  def _per_row(self, draw, salt: int, dtype):
    return tf.map_fn(draw, self.example_seeds(salt), fn_output_signature=dtype)
