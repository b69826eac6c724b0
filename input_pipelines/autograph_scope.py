"""AutoGraph converts the user's code, not distloop's.

AutoGraph rewrites the Python of every function a `tf.function` reaches (its AST, then
its source, per function), except libraries it is told to leave alone: TensorFlow's and
Keras's own (Keras's `fit` turns it off for its steps altogether). Converting distloop's
own step machinery -- the reductions, the optimizer update, the sums, the tf.data
functions -- was half of a short run's start-up (5.6 s of 14.8 s for one step of the seed
CNN on 2 busy cores; docs/performance.md "Start-up"), and it buys nothing: that code is
written with `tf.cond` / `tf.while_loop` where it branches on a tensor, and a Python `if`
on a tensor fails loudly at trace time rather than silently.

So distloop's packages join that list, and where distloop calls code a user wrote inside a
traced function (a Task's `train_step` / `eval_step`, a `data.preprocess`, a source's
`assemble`, a loss or metric plug-in, an Export's `transform`), it calls it through
`user_function`, which converts it as a `tf.function` of the user's own would: a Python
`if` / `for` / `while` on a tensor there works as before. distloop's own `tf.function`s
are still converted at their top level (`tf.function` asks for it), so a compiled loop's
`for i in tf.range(n)` stays a graph loop.

Here, under input_pipelines, because its tf.data functions are traced too and
input_pipelines imports nothing from trainer/.
"""
from typing import Callable

import tensorflow as tf
from tensorflow.python.autograph.core import config as _autograph_config  # pylint: disable=g-direct-tensorflow-import
from tensorflow.python.autograph.core import config_lib as _autograph_rules  # pylint: disable=g-direct-tensorflow-import

# distloop's top-level packages (docs/layout.md): code AutoGraph leaves as written.
DISTLOOP_PACKAGES = ("trainer", "input_pipelines", "models", "configs")


def _leave_distloop_unconverted() -> None:
  """Adds distloop's packages to AutoGraph's do-not-convert rules (once per process).
  The rules are TensorFlow's internal table (TensorFlow's own entry sits there too); if
  a TensorFlow release renames it, distloop's code is converted again: slower, as correct."""
  rules = getattr(_autograph_config, "CONVERSION_RULES", None)
  if rules is None:
    return
  present = {getattr(rule, "module_prefix", None) for rule in rules}
  missing = tuple(_autograph_rules.DoNotConvert(package) for package in DISTLOOP_PACKAGES
                  if package not in present)
  if missing:
    _autograph_config.CONVERSION_RULES = missing + tuple(rules)


def user_function(function: Callable) -> Callable:
  """`function` (user code called inside a traced function) as AutoGraph would call it
  from the user's own `tf.function`: converted when the trace converts, as written under
  `tf.function(autograph=False)`. distloop's own callables (the built-in Task, built-in
  losses) pass through unconverted, by the rules above."""
  def call(*args, **kwargs):  # not functools.wraps: its __module__ would be the user's
    context = tf.__internal__.autograph.control_status_ctx()
    return tf.__internal__.autograph.tf_convert(function, context)(*args, **kwargs)
  return call


_leave_distloop_unconverted()
