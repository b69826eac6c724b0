"""`data.preprocess`: resolved, traced once on the training examples' spec, and checked.

Who owns what: the user's function says how one example is transformed;
distloop owns the seed it gets (`[runtime.seed, position of the example]`,
input_pipelines/batching.py), which makes augmentation random yet the same
after a resume. A function that draws randomness of its own (an op that keeps
state between calls: `tf.random.uniform`, `tf.image.random_*`, a
`tf.random.Generator`, a Keras random layer whose seed lives in a variable)
would feed a resumed run other examples than an uninterrupted one: it is
refused at start-up (exit 2), naming the op and its stateless replacement.

Tracing here, before tf.data does, also makes an error the function raises one
short line naming the plug-in (autograph's rewritten message is stripped).
Reading a variable is allowed (a lookup or normalization layer's constants);
writing one is not (that is state carried from example to example).
"""
import re
from typing import Callable

import tensorflow as tf

from input_pipelines import batching
from input_pipelines.sources import Source
from trainer.setup import plugins
from trainer.analysis import stateful_ops

FIELD = "data.preprocess"

# Name scopes of the stateful APIs -> the stateless call that replaces them.
_STATELESS = {
    **{f"random_{what}": f"tf.image.stateless_random_{what}({args}, seed=seed)"
       for what, args in (("flip_left_right", "image"), ("flip_up_down", "image"),
                          ("brightness", "image, max_delta"), ("contrast", "image, lower, upper"),
                          ("hue", "image, max_delta"), ("saturation", "image, lower, upper"),
                          ("jpeg_quality", "image, min_quality, max_quality"),
                          ("crop", "value, size"))},
    "random_flip": "tf.image.stateless_random_flip_left_right(image, seed=seed)",  # Keras
    "random_uniform": "tf.random.stateless_uniform(shape, seed=seed)",
    "random_normal": "tf.random.stateless_normal(shape, seed=seed)",
    "truncated_normal": "tf.random.stateless_truncated_normal(shape, seed=seed)",
    "random_shuffle": "tf.gather(x, tf.argsort(tf.random.stateless_uniform([n], seed=seed)))",
    "categorical": "tf.random.stateless_categorical(logits, n, seed=seed)",
    "multinomial": "tf.random.stateless_categorical(logits, n, seed=seed)",
    "random_gamma": "tf.random.stateless_gamma(shape, alpha, seed=seed)",
    "random_poisson": "tf.random.stateless_poisson(shape, lam, seed=seed)",
    "sample_distorted_bounding_box":
        "tf.image.stateless_sample_distorted_bounding_box(..., seed=seed)",
}
_GENERIC = ("tf.random.stateless_uniform(shape, seed=seed) or "
            "tf.image.stateless_random_flip_left_right(image, seed=seed)")


def resolve(spec: str, train_source: Source) -> Callable | None:
  """`data.preprocess` as the tf.data function batching maps over training examples,
  traced and checked on the training split's example spec; None if unset."""
  if not spec:
    return None
  function = plugins.resolve(FIELD, spec)

  def preprocess(features, labels, seed):
    result = plugins.call(FIELD, spec, function, features, labels, seed)
    if not isinstance(result, tuple) or len(result) != 2:
      raise plugins.UserError(f"{FIELD}={spec!r} must return (features, labels), "
                              f"got {type(result).__name__}")
    return result

  _check(spec, preprocess, batching.example_spec(train_source))
  return preprocess


def _check(spec: str, preprocess: Callable, example_spec) -> None:
  features_spec, labels_spec = example_spec
  try:
    graph = tf.function(preprocess).get_concrete_function(
        features_spec, labels_spec, tf.TensorSpec([2], tf.int64)).graph
  except plugins.UserError as e:
    raise plugins.UserError(plugins.without_autograph(str(e), "UserError")) from None
  except Exception as e:  # pylint: disable=broad-except  (tracing user code raises anything)
    raise plugins.UserError(f"{FIELD}={spec!r} raised {type(e).__name__}: "
                            f"{plugins.without_autograph(str(e), type(e).__name__)}") from None
  stateful = stateful_ops.first(graph.as_graph_def())
  if stateful is not None:
    name, op = stateful
    raise plugins.UserError(
        f"{FIELD}={spec!r} draws randomness of its own ({op} in {name}), so a resumed run "
        f"would see other examples: use the stateless ops with the per-example `seed` "
        f"distloop passes, e.g. {_replacement(name, op)}")


def _replacement(name: str, op: str) -> str:
  """The stateless call for the API whose name scope `name` shows, outermost first."""
  replacement = next((_STATELESS[scope] for scope in
                      (re.sub(r"_\d+$", "", scope) for scope in name.split("/"))
                      if scope in _STATELESS), _GENERIC)
  if op in stateful_ops.VARIABLE_WRITES or op in stateful_ops.VARIABLE_RANDOM_OPS:
    replacement += (" (a Keras random layer or a tf.random.Generator keeps its state in a "
                    "variable: call the stateless ops in the function instead)")
  return replacement


