"""Optimizers, and the one place where gradients become an update.

Why not `optimizer.apply(grads)`: Keras 3's TensorFlow optimizer all-reduces
(SUM) the gradients by itself whenever it runs in a replica context
(keras/src/backend/tensorflow/optimizer.py, `_all_reduce_sum_gradients`), and
from a cross-replica context its `apply` cannot run at all. The trainer owns
the reduction (one explicit all-reduce with CommunicationOptions, in
trainer/loop/steps.py), so it applies the already-reduced gradients here with
Keras's public per-variable hook, `update_step`, under
`strategy.extended.update` -- the very path Keras takes after its own reduction.
What `apply` adds around `update_step` is done here too (decoupled weight decay,
variable constraints, Nadam's momentum product) or refused in one line
(`check_supported`: Keras-side clipping, EMA, accumulation, loss scaling, a class
that overrides the apply path), so nothing is silently skipped.
"""
import contextlib
import re
import weakref

import keras
import ml_collections
import tensorflow as tf

from trainer.cluster import runtime
from trainer.cluster import sharding
from trainer.errors import UserError
from trainer.setup import plugins
from trainer.setup import validation


def learning_rate(train_config: ml_collections.ConfigDict):
  """train.learning_rate, or a schedule of the optimizer's step count (train.lr_schedule:
  a built-in, or MODULE:FUNCTION(train_config) returning a float or a Keras
  LearningRateSchedule).

  The step count is checkpointed with the optimizer, so a resumed run continues
  the schedule where it was.
  """
  lr = train_config.learning_rate
  schedule = train_config.lr_schedule
  if plugins.is_plugin(schedule):
    value = plugins.call("train.lr_schedule", schedule,
                         plugins.resolve("train.lr_schedule", schedule), train_config)
    if isinstance(value, bool) or not isinstance(
        value, (int, float, keras.optimizers.schedules.LearningRateSchedule)):
      raise UserError(f"train.lr_schedule={schedule!r} returned {type(value).__name__}, not a "
                      f"number or a keras.optimizers.schedules.LearningRateSchedule")
    return value
  if schedule == "constant":
    return lr
  if schedule == "cosine":  # linear warmup from 0, then cosine decay to 0 at train.steps
    warmup = train_config.warmup_steps
    return keras.optimizers.schedules.CosineDecay(
        initial_learning_rate=0.0 if warmup else lr, decay_steps=train_config.steps - warmup,
        warmup_target=lr if warmup else None, warmup_steps=warmup)
  if schedule == "step":  # times lr_decay_rate every lr_decay_steps steps
    return keras.optimizers.schedules.ExponentialDecay(
        lr, decay_steps=train_config.lr_decay_steps, decay_rate=train_config.lr_decay_rate,
        staircase=True)
  raise ValueError(f"unknown lr_schedule {schedule!r}")  # validation.py refuses it earlier


class Factored(keras.optimizers.schedules.LearningRateSchedule):
  """`base` (a rate, or a schedule of the step count) times `factor`, a float32 variable
  of the run that trainer/loop/learning_rate.py assigns between loops (train.lr_on_plateau,
  an Action with sets_learning_rate=True). Only when one is on: otherwise the optimizer
  gets `base` itself, its variables as they always were."""

  def __init__(self, base, factor: tf.Variable):
    self.base = base
    self.factor = factor

  def __call__(self, step):
    base = self.base
    if isinstance(base, keras.optimizers.schedules.LearningRateSchedule):
      base = base(step)
    return tf.cast(base, tf.float32) * self.factor

  def get_config(self):
    return {"base": self.base, "factor": "the run's learning rate factor"}


# train.optimizer's names -> Keras's classes; "momentum" is SGD with train.momentum.
_CLASSES = {"sgd": "SGD", "momentum": "SGD", "adam": "Adam", "adamw": "AdamW",
            "adamax": "Adamax", "nadam": "Nadam", "rmsprop": "RMSprop", "adagrad": "Adagrad",
            "adadelta": "Adadelta", "adafactor": "Adafactor", "ftrl": "Ftrl", "lamb": "Lamb",
            "lion": "Lion"}


def create(train_config: ml_collections.ConfigDict,
           learning_rate_factor: tf.Variable | None = None) -> keras.optimizers.Optimizer:
  """train.optimizer: a Keras optimizer by name, with train.learning_rate (or its schedule),
  train.weight_decay and train.optimizer_args; or MODULE:FUNCTION(train_config) returning
  a Keras optimizer. Either way checked (`check_supported`) and given
  train.weight_decay_exclude. `learning_rate_factor`: the rate is `Factored` by it (a
  built-in optimizer only: a user's builds its own rate, refused where a factor is on)."""
  spec = train_config.optimizer
  if plugins.is_plugin(spec):
    optimizer = plugins.call("train.optimizer", spec,
                             plugins.resolve("train.optimizer", spec), train_config)
    if not isinstance(optimizer, keras.optimizers.Optimizer):
      raise UserError(f"train.optimizer={spec!r} returned {type(optimizer).__name__}, not a "
                      f"keras.optimizers.Optimizer")
    if learning_rate_factor is not None:  # validation.py refuses train.lr_on_plateau first
      raise UserError(f"train.optimizer={spec!r} builds its own learning rate, which a "
                      f"learning rate factor (train.lr_on_plateau, an Action with "
                      f"sets_learning_rate=True) cannot scale: use a built-in optimizer")
  else:
    arguments = validation.optimizer_arguments(train_config)
    if spec in ("momentum", "rmsprop"):
      arguments.setdefault("momentum", train_config.momentum)
    if train_config.weight_decay:
      arguments["weight_decay"] = train_config.weight_decay
    if train_config.ema_decay:
      arguments.update(use_ema=True, ema_momentum=train_config.ema_decay)
    cls = getattr(keras.optimizers, _CLASSES[spec])
    try:
      rate = learning_rate(train_config)
      if learning_rate_factor is not None:
        rate = Factored(rate, learning_rate_factor)
      optimizer = cls(learning_rate=rate, **arguments)
    except (TypeError, ValueError) as error:
      raise UserError(f"train.optimizer_args={train_config.optimizer_args!r}: {cls.__name__} "
                      f"refused them: {str(error).splitlines()[0]}") from None
  check_supported(optimizer, f"train.optimizer={spec!r}")
  _EXCLUDED_FROM_DECAY[optimizer] = exclusion_rule(train_config.weight_decay_exclude)
  return optimizer


# What Keras's `apply()` adds around the update, which distloop does itself or not at all.
_APPLY_SETTINGS = {
    "clipnorm": "set train.clip_grad_norm instead (distloop clips after its one all-reduce)",
    "clipvalue": "distloop clips by global norm only: set train.clip_grad_norm",
    "global_clipnorm": "set train.clip_grad_norm instead (distloop clips after its one "
                       "all-reduce)",
    "ema_overwrite_frequency": "distloop keeps the average apart and evaluates and exports "
                               "it (train.ema_eval); it does not overwrite the weights",
    "gradient_accumulation_steps": "Keras accumulates in optimizer.apply(), which distloop "
                                   "does not call",
    "loss_scale_factor": "set runtime.mixed_precision=float16: distloop scales the loss "
                         "itself, per optimizer",
}
# Keras methods on the apply path: a class that overrides one does work there that
# update_step alone would skip (Nadam's, handled in _update, is the exception).
_KERAS_BASES = ("keras.src.optimizers.base_optimizer", "keras.src.optimizers.optimizer",
                "keras.src.backend.tensorflow.optimizer")
_APPLY_PATH = ("apply", "apply_gradients", "_backend_apply_gradients", "_backend_update_step",
               "_apply_weight_decay")


def check_supported(optimizer, where: str) -> None:
  """UserError, in one line, for an optimizer whose settings live in Keras's `apply()`
  (clipping, EMA, accumulation, loss scaling) or whose class changes that path: distloop
  applies reduced gradients with `update_step` (see the module docstring), so those
  would be skipped silently."""
  name = type(optimizer).__name__
  if hasattr(optimizer, "inner_optimizer") or isinstance(
      optimizer, getattr(keras.optimizers, "MultiOptimizer", ())):
    raise UserError(f"{where}: a {name} wraps other optimizers; give distloop the optimizer "
                    f"itself (float16 loss scaling: runtime.mixed_precision)")
  for setting, instead in _APPLY_SETTINGS.items():
    value = getattr(optimizer, setting, None)
    unused = (None, 1) if setting == "gradient_accumulation_steps" else (None,)
    if value not in unused:
      raise UserError(f"{where}: {name}({setting}={value!r}) is not supported: {instead}")
  for method in _APPLY_PATH:
    owner = next((cls for cls in type(optimizer).__mro__ if method in vars(cls)), None)
    if owner is None or owner is keras.optimizers.Nadam or owner.__module__ in _KERAS_BASES:
      continue
    raise UserError(f"{where}: {name} overrides {method}(), which distloop does not call "
                    f"(it applies reduced gradients with update_step): not supported")


# optimizer -> the rule of train.weight_decay_exclude it was created with.
_EXCLUDED_FROM_DECAY = weakref.WeakKeyDictionary()


def exclusion_rule(text: str):
  """train.weight_decay_exclude as `excluded(variable) -> bool`: `1d` (every variable of
  rank 0 or 1: biases, normalization scales and offsets) and regular expressions searched
  in the variable's path, comma-separated; empty: none excluded."""
  entries = [entry.strip() for entry in text.split(",") if entry.strip()]
  patterns = [re.compile(entry) for entry in entries if entry != "1d"]
  vectors = "1d" in entries

  def excluded(variable) -> bool:
    return ((vectors and len(variable.shape) <= 1)
            or any(pattern.search(variable.path) for pattern in patterns))
  return excluded


def decays(optimizer, variable) -> bool:
  """Whether `optimizer` decays `variable`: it has a weight_decay, Keras's own exclusions
  (exclude_from_weight_decay) spare it not, and neither does train.weight_decay_exclude
  (for optimizers distloop created)."""
  if not getattr(optimizer, "weight_decay", None):
    return False
  if not optimizer._use_weight_decay(variable):  # pylint: disable=protected-access
    return False
  excluded = _EXCLUDED_FROM_DECAY.get(optimizer)
  return not (excluded and excluded(variable))


def averages_of(optimizer, variables) -> list:
  """The moving averages (Keras's use_ema slots) of `variables`, or [] without use_ema."""
  if not getattr(optimizer, "use_ema", False):
    return []
  averages = optimizer._model_variables_moving_average  # pylint: disable=protected-access
  return [averages[optimizer._get_variable_index(variable)]  # pylint: disable=protected-access
          for variable in variables]


@contextlib.contextmanager
def averaged_weights(optimizers):
  """Inside: every variable an optimizer with use_ema updates holds its moving average;
  after: its own value again (eval, keep-best and export see the average, training goes
  on from the weights it trained). Cross-replica context: each assignment reaches every
  replica's copy."""
  pairs = [(variable, average) for optimizer in optimizers
           for variable, average in zip(
               getattr(optimizer, "_trainable_variables", []),
               averages_of(optimizer, getattr(optimizer, "_trainable_variables", [])))]
  if not pairs:
    yield
    return
  trained = [tf.identity(variable.value) for variable, _ in pairs]
  for variable, average in pairs:
    variable.assign(average.value)
  try:
    yield
  finally:
    for (variable, _), value in zip(pairs, trained):
      variable.assign(value)


def describe(optimizer, variables) -> str:
  """For the start-up log: 'AdamW(weight_decay=0.004, on 4 of 8 variables; moving average
  0.999)'."""
  settings = []
  if getattr(optimizer, "weight_decay", None):
    decayed = sum(decays(optimizer, variable) for variable in variables)
    settings.append(f"weight_decay={optimizer.weight_decay:g}, on {decayed} of "
                    f"{len(variables)} variables")
  if getattr(optimizer, "use_ema", False):
    settings.append(f"moving average {optimizer.ema_momentum:g}")
  return type(optimizer).__name__ + (f"({'; '.join(settings)})" if settings else "")


def apply_reduced_gradients(strategy: tf.distribute.Strategy,
                            optimizer: keras.optimizers.Optimizer,
                            reduced_grads, variables, loss_scale=None, finite=None,
                            jit_compile: bool = False, fused_kernels: bool = True) -> None:
  """One optimizer step from gradients already summed over replicas.

  Runs in cross-replica context (inside `ReplicaContext.merge_call`), so no
  replica context exists for Keras to all-reduce in. One `extended.update`
  updates every variable: on each device it runs `_update_all` once, in that
  device's update context, where every mirrored variable (weights and slots)
  resolves to the device's own copy; `jit_compile` makes it one XLA cluster per
  device instead of a few small ops per variable.
  With a `loss_scale` (float16) the gradients arrive unscaled with their
  `finite` verdict: a step whose reduced gradients overflowed is skipped -- on
  every replica alike, since they all saw the same reduced gradients -- and the
  scale shrinks. `fused_kernels`: see _fused_step (off where XLA compiles the step).
  """
  if loss_scale is None:
    _update(strategy, optimizer, reduced_grads, variables, jit_compile, fused_kernels)
    return
  finite = strategy.experimental_local_results(finite)[0]  # equal on every replica

  def apply():
    _update(strategy, optimizer, reduced_grads, variables, jit_compile, fused_kernels)
    loss_scale.after_finite_step()
    return tf.constant(True)

  def skip():
    loss_scale.after_non_finite_step()
    return tf.constant(False)

  tf.cond(finite, apply, skip)


def _fused_step(optimizer: keras.optimizers.Optimizer):
  """`step(grad, variable, learning_rate)`: Keras's `update_step` for this optimizer as one
  fused TensorFlow kernel per variable (ResourceApplyAdam, ...KerasMomentum,
  ...GradientDescent: the same formulas), or None where there is none.

  Keras's update is about a dozen elementwise ops per variable, each a pass over it;
  the fused kernel is one. Measured on a 2-core CPU (oneDNN): 5-9% of the seed CNN's
  step. Used where XLA does not compile the update (it fuses them itself), for
  variables of at least _FUSED_MIN_ELEMENTS.
  """
  # AdamW is Adam's update_step; its decay is a separate step (_update).
  if type(optimizer) in (keras.optimizers.Adam, keras.optimizers.AdamW) and (
      not optimizer.amsgrad):
    def adam(grad, variable, learning_rate):
      index = optimizer._get_variable_index(variable)  # pylint: disable=protected-access
      dtype = variable.dtype
      step = tf.cast(optimizer.iterations + 1, dtype)
      beta_1, beta_2 = tf.cast(optimizer.beta_1, dtype), tf.cast(optimizer.beta_2, dtype)
      tf.raw_ops.ResourceApplyAdam(
          var=variable.value.handle,
          m=optimizer._momentums[index].value.handle,  # pylint: disable=protected-access
          v=optimizer._velocities[index].value.handle,  # pylint: disable=protected-access
          beta1_power=tf.pow(beta_1, step), beta2_power=tf.pow(beta_2, step),
          lr=tf.cast(learning_rate, dtype), beta1=beta_1, beta2=beta_2,
          epsilon=tf.cast(optimizer.epsilon, dtype), grad=tf.cast(grad, dtype))
    return adam
  if type(optimizer) is keras.optimizers.SGD and not optimizer.nesterov:
    def sgd(grad, variable, learning_rate):
      dtype = variable.dtype
      if optimizer.momentum == 0:
        tf.raw_ops.ResourceApplyGradientDescent(
            var=variable.value.handle, alpha=tf.cast(learning_rate, dtype),
            delta=tf.cast(grad, dtype))
        return
      momentum = optimizer.momentums[optimizer._get_variable_index(variable)]  # pylint: disable=protected-access
      tf.raw_ops.ResourceApplyKerasMomentum(
          var=variable.value.handle, accum=momentum.value.handle,
          lr=tf.cast(learning_rate, dtype), grad=tf.cast(grad, dtype),
          momentum=tf.cast(optimizer.momentum, dtype), use_nesterov=False)
    return sgd
  return None


# A fused kernel spreads even a tiny variable over the CPU's thread pool: below this size
# Keras's few inline ops are cheaper (an 8-unit MLP at batch 1 ran at 0.8x with every
# variable fused).
_FUSED_MIN_ELEMENTS = 1 << 14


def _update(strategy, optimizer, grads, variables, jit_compile: bool,
            fused_kernels: bool = True) -> None:
  fused = _fused_step(optimizer) if fused_kernels and not jit_compile else None
  # A sharded variable takes Keras's update_step: its assignments split over the shards
  # (a fused kernel needs one variable handle).
  steps = [fused if fused and variable.shape.num_elements() >= _FUSED_MIN_ELEMENTS
           and not sharding.is_sharded(variable) else optimizer.update_step
           for variable in variables]

  decayed = [decays(optimizer, variable) for variable in variables]
  averages = averages_of(optimizer, variables)
  constrained = [getattr(variable, "constraint", None) for variable in variables]

  def update_all(*device_grads):
    # What Keras's apply() does around update_step, in its order: decoupled weight
    # decay, (Nadam's momentum product), the update, the moving average (use_ema), the
    # step count, the variables' constraints.
    learning_rate = optimizer.learning_rate
    for decay, variable in zip(decayed, variables):
      if decay:
        variable.assign(variable - variable * tf.cast(optimizer.weight_decay, variable.dtype)
                        * tf.cast(learning_rate, variable.dtype))
    if isinstance(optimizer, keras.optimizers.Nadam):  # its _backend_update_step
      product = optimizer._u_product  # pylint: disable=protected-access
      product.assign(product * optimizer.beta_1 * (1.0 - 0.5 * tf.pow(
          0.96, tf.cast(optimizer.iterations + 1, product.dtype))))
    for step, grad, variable in zip(steps, device_grads, variables):
      step(grad, variable, learning_rate)
    if averages:  # Keras's _update_model_variables_moving_average: the first step copies
      momentum = tf.cast(tf.not_equal(optimizer.iterations, 0), tf.float32) * (
          optimizer.ema_momentum)
      for average, variable in zip(averages, variables):
        rate = tf.cast(momentum, variable.dtype)
        average.assign(rate * average + (1 - rate) * variable)
    optimizer.iterations.assign_add(1)
    for constraint, variable in zip(constrained, variables):
      if constraint is not None:
        variable.assign(constraint(variable))

  # Where the variables live on the step's device, the update's ops are the step's own (a
  # nested function call cost a tiny model 4% of its step); XLA compiles it as one function
  # per device. Where they live elsewhere (a parameter server, central_storage's CPU) the
  # function runs there in one call: op by op, each op is a round trip (central_storage
  # alone on an H100: 9% slower).
  in_function = jit_compile or runtime.variables_off_the_compute_device(strategy) is not None

  def on_device(unused_first_variable, *device_grads):
    # In the device's update context every variable is that device's copy.
    if in_function:
      return tf.function(update_all, jit_compile=jit_compile, autograph=False)(*device_grads)
    return update_all(*device_grads)

  # The tf.Variable (a MirroredVariable) the update runs by; a sharded one has no single
  # device: its first shard's then.
  anchor = next((variable.value for variable in variables if not sharding.is_sharded(variable)),
                None)
  strategy.extended.update(anchor if anchor is not None else sharding.shards(variables[0])[0],
                           on_device, args=tuple(grads), group=False)
