"""Optimizers, and the one place where gradients become an update.

Why not `optimizer.apply(grads)`: Keras 3's TensorFlow optimizer all-reduces
(SUM) the gradients by itself whenever it runs in a replica context
(keras/src/backend/tensorflow/optimizer.py, `_all_reduce_sum_gradients`), and
from a cross-replica context its `apply` cannot run at all. The trainer owns
the reduction (one explicit all-reduce with CommunicationOptions, in
trainer/loop/steps.py), so it applies the already-reduced gradients here with
Keras's public per-variable hook, `update_step`, under
`strategy.extended.update` -- the very path Keras takes after its own reduction.
Because the trainer builds every optimizer itself (below), nothing that `apply`
would add -- weight decay, clipping, EMA -- is silently skipped.
"""
import keras
import ml_collections
import tensorflow as tf


def learning_rate(train_config: ml_collections.ConfigDict):
  """train.learning_rate, or a schedule of the optimizer's step count (train.lr_schedule).

  The step count is checkpointed with the optimizer, so a resumed run continues
  the schedule where it was.
  """
  lr = train_config.learning_rate
  schedule = train_config.lr_schedule
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


def create(train_config: ml_collections.ConfigDict) -> keras.optimizers.Optimizer:
  lr = learning_rate(train_config)
  name = train_config.optimizer
  if name == "sgd":
    return keras.optimizers.SGD(lr)
  if name == "momentum":
    return keras.optimizers.SGD(lr, momentum=train_config.momentum)
  if name == "adam":
    return keras.optimizers.Adam(lr)
  if name == "rmsprop":
    return keras.optimizers.RMSprop(lr, momentum=train_config.momentum)
  if name == "adagrad":
    return keras.optimizers.Adagrad(lr)
  raise ValueError(f"unknown optimizer {name!r}")  # validation.py refuses it earlier


def apply_reduced_gradients(strategy: tf.distribute.Strategy,
                            optimizer: keras.optimizers.Optimizer,
                            reduced_grads, variables, loss_scale=None, finite=None,
                            jit_compile: bool = False, fused_kernels: bool = True) -> None:
  """One optimizer step from gradients already summed over replicas.

  Runs in cross-replica context (inside `ReplicaContext.merge_call`), so no
  replica context exists for Keras to all-reduce in. One `extended.update`
  updates every variable: on each device it runs `_update_all` once, in that
  device's update context, where every mirrored variable (weights and slots)
  resolves to the device's own copy -- one function per device, which
  `jit_compile` makes one XLA cluster instead of one small op per variable.
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
  if type(optimizer) is keras.optimizers.Adam and not optimizer.amsgrad:
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
  steps = [fused if fused and variable.shape.num_elements() >= _FUSED_MIN_ELEMENTS
           else optimizer.update_step for variable in variables]

  def update_all(*device_grads):
    learning_rate = optimizer.learning_rate
    for step, grad, variable in zip(steps, device_grads, variables):
      step(grad, variable, learning_rate)
    optimizer.iterations.assign_add(1)

  def on_device(unused_first_variable, *device_grads):
    # A function per device: a trace captures that device's copies of the variables.
    return tf.function(update_all, jit_compile=jit_compile, autograph=False)(*device_grads)

  strategy.extended.update(variables[0].value,  # the tf.Variable (a MirroredVariable)
                           on_device, args=tuple(grads), group=False)
