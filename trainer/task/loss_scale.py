"""Dynamic loss scaling for float16 mixed precision, owned by the trainer.

float16 gradients of a small loss underflow to zero. The replica step scales
the loss up before backprop; after the one all-reduce the update unscales the
summed gradients (trainer/task/optimizers.py), and a step whose gradients overflowed
is skipped. The scale halves after such a step and doubles after
`growth_interval` finite steps in a row (the policy of Keras's
LossScaleOptimizer, which cannot be used here: its `apply` would all-reduce a
second time). Both variables are mirrored, so every replica scales alike, and
checkpointed with the optimizer, so a resumed run goes on with the same scale.
"""
import tensorflow as tf

_INITIAL_SCALE = 2.0 ** 15
_GROWTH_INTERVAL = 2000


class DynamicLossScale:
  """Create inside `strategy.scope()`."""

  def __init__(self, initial_scale: float = _INITIAL_SCALE,
               growth_interval: int = _GROWTH_INTERVAL):
    self._growth_interval = growth_interval
    self.scale = tf.Variable(initial_scale, dtype=tf.float32, trainable=False, name="scale")
    self.finite_steps = tf.Variable(0, dtype=tf.int64, trainable=False, name="finite_steps")

  def variables(self) -> dict:
    """Checkpoint keys -> variables (saved with the optimizer state)."""
    return {"loss_scale/scale": self.scale, "loss_scale/finite_steps": self.finite_steps}

  def scale_loss(self, loss):
    return loss * tf.cast(self.scale, loss.dtype)

  def unscale(self, grads):
    """(gradients / scale, whether all are finite); in replica context, after the reduction."""
    grads = [tf.cast(g, tf.float32) / self.scale for g in grads]
    return grads, tf.reduce_all([tf.reduce_all(tf.math.is_finite(g)) for g in grads])

  def after_finite_step(self) -> None:
    grow = self.finite_steps + 1 >= self._growth_interval
    self.finite_steps.assign(tf.where(grow, tf.constant(0, tf.int64), self.finite_steps + 1))
    self.scale.assign(tf.where(grow, self.scale * 2.0, self.scale))

  def after_non_finite_step(self) -> None:
    self.finite_steps.assign(0)
    self.scale.assign(tf.maximum(self.scale / 2.0, 1.0))
