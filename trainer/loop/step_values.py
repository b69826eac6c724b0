"""What a step returns, checked: `{name: value}`, each value per example ([batch], one
per example of the batch) or per step (a scalar), under no name distloop reports itself.

Checked when the step is traced (check_values, called by trainer/loop/steps.py's
discover), so a wrong value fails in one line before anything runs; a length unknown
when traced (an eval batch) is checked as the step runs, inside the compiled loop
(per_example, called by steps.Sums).
"""
import fnmatch

import tensorflow as tf

from trainer.errors import UserError


# Names distloop reports itself next to a step's values (the example count, the learning
# rates, the throughput, the gradient norms, the epoch, summary.json's train_/eval_time_sec,
# the eval mode's step): a value of the same name would be overwritten by distloop's, or
# overwrite it.
RESERVED = ("examples", "step", "examples_per_sec", "steps_per_sec", "time_sec",
            "learning_rate", "learning_rate_*", "gradient_norm", "*_gradient_norm", "epoch")


def is_reserved(name: str) -> bool:
  return any(fnmatch.fnmatchcase(name, pattern) for pattern in RESERVED)


def check_values(what: str, values, batch_size: int | None = None,
                 lengths_must_be_static: bool = False) -> dict:
  """A step's return value, at trace time: {name: per-example [batch] or scalar}, no
  name distloop reports itself. `batch_size`: the traced batch's static size, which a
  per-example value's static length must equal (an unknown length is checked when the
  step runs: per_example). `lengths_must_be_static`: the step runs as one XLA cluster,
  which cannot hold that run-time check, so an unknown length is refused here."""
  if not isinstance(values, dict) or not all(isinstance(name, str) for name in values):
    kind = "a tensor" if tf.is_tensor(values) else type(values).__name__
    raise UserError(f"{what} returned {kind}; it returns a dict of named "
                    f"per-example values ({{'loss': per_example_loss, ...}})")
  for name, value in values.items():
    if is_reserved(name):
      raise UserError(f"{what} returned {name!r}, a name distloop reports itself; rename it "
                      f"(reserved: {', '.join(RESERVED)})")
    if not tf.is_tensor(value) and not isinstance(value, (float, int)):
      raise UserError(f"{what} returned {name!r} as {type(value).__name__}, not a tensor")
    shape = tf.convert_to_tensor(value).shape
    if shape.rank not in (0, 1):
      raise UserError(f"{what} returned {name!r} of rank {shape.rank}: values are per "
                      f"example (shape [batch]) or per step (a scalar)")
    if shape.rank == 1 and None not in (shape[0], batch_size) and shape[0] != batch_size:
      raise UserError(_wrong_length(what, name, shape[0], batch_size))
    if shape.rank == 1 and shape[0] is None and lengths_must_be_static:
      raise UserError(f"{what} returned {name!r} of a length unknown when traced: with the "
                      f"whole step under XLA (runtime.jit_compile) it cannot be checked as "
                      f"the step runs; give it the batch's length (tf.ensure_shape(value, "
                      f"[batch_size])) or set runtime.jit_compile=false")
  return values


def _wrong_length(what: str, name: str, length, batch_size) -> str:
  return (f"{what} returned {name!r} of length {length} on a batch of {batch_size} "
          f"examples: values are per example (shape [batch]) or per step (a scalar)")


def per_example(what: str, name: str, value, count):
  """`value` [n], checked to hold one value per example of the batch (`count`, float64)
  when either length is unknown at trace time (an eval batch), by an assertion that runs
  with the step (api.translate makes its failure the one line); static lengths were
  checked when the step was traced (check_values)."""
  length, batch_size = value.shape[0], tf.get_static_value(count)
  if length is not None and batch_size is not None:
    return value
  length = tf.shape(value, out_type=tf.int64)[0]
  batch = tf.cast(count, tf.int64)
  message = tf.strings.format(_wrong_length(what, name.replace("{", "(").replace("}", ")"),
                                            "{}", "{}"), (length, batch))
  with tf.control_dependencies([tf.debugging.Assert(tf.equal(length, batch), [message])]):
    return tf.identity(value)
