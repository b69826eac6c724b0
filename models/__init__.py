"""Model registry: `config.model.name` -> a builder `(model_config, input_spec) -> keras.Model`.

A built-in name maps to the `build` of models/<name>.py; `MODULE:FUNCTION` names
the user's own builder (trainer/plugins.py). `input_spec` is the features'
`tf.TensorSpec` (or a dict of them) with batch dimension None, as the input
pipeline delivers them. A model maps features to outputs (logits for the
cross-entropy losses). Built-in layers carry explicit names, so variable paths
(and with them checkpoint keys) are the same in every process. Builders are
imported on first use: checking a config never imports Keras.
"""
import importlib

import ml_collections

from trainer import plugins

_MODULES = {
    "mnist_cnn": "models.mnist_cnn",
    "mlp": "models.mlp",
    "tabular": "models.tabular",
}

NAMES = tuple(_MODULES)
NEEDS_NUM_CLASSES = ("mnist_cnn", "mlp")  # their last layer has model.num_classes logits


def builder(model_config: ml_collections.ConfigDict):
  """The builder `model.name` names; UserError if it does not resolve."""
  if model_config.name in _MODULES:
    return lambda *args: importlib.import_module(_MODULES[model_config.name]).build(*args)
  return plugins.resolve("model.name", model_config.name, dict.fromkeys(NAMES))


def build(model_config: ml_collections.ConfigDict, input_spec):
  """A new keras.Model (call inside `strategy.scope()` to distribute it)."""
  import keras  # pylint: disable=g-import-not-at-top
  model = plugins.call("model.name", model_config.name, builder(model_config), model_config,
                       input_spec)
  if not isinstance(model, keras.Model):
    raise plugins.UserError(f"model.name={model_config.name!r} returned "
                            f"{type(model).__name__}, not a keras.Model")
  return model


def single_input(name: str, input_spec):
  """The shape and dtype of a built-in model's one input; UserError for dict features."""
  if isinstance(input_spec, dict):
    raise plugins.UserError(f"model.name={name!r} takes one array of features, not a dict "
                            f"({', '.join(input_spec)}); use your own model (MODULE:FUNCTION)")
  return tuple(input_spec.shape[1:]), input_spec.dtype
