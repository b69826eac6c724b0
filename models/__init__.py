"""Model registry: `config.model.name` -> a builder `(model_config, input_spec) -> keras.Model`.

A built-in name maps to the `build` of models/<name>.py (`BUILTINS`);
`MODULE:FUNCTION`, the user's own builder, is resolved by trainer/setup/plugins.py
(this package imports nothing from trainer/). `input_spec` is the features'
`tf.TensorSpec` (or a dict of them) with batch dimension None, as the input
pipeline delivers them. A model maps features to outputs (logits for the
cross-entropy losses). Built-in layers carry explicit names, so variable paths
(and with them checkpoint keys) are the same in every process. Builders are
imported on first use: checking a config never imports Keras.
"""
import importlib

import ml_collections

_MODULES = {
    "mnist_cnn": "models.mnist_cnn",
    "mlp": "models.mlp",
    "tabular": "models.tabular",
    "recommender": "models.recommender",
}

NEEDS_NUM_CLASSES = ("mnist_cnn", "mlp")  # their last layer has model.num_classes logits


class ModelError(ValueError):
  """A built-in model cannot take the data as given (one line, exit 2)."""


def _imported_on_first_use(module: str):
  return lambda *args: importlib.import_module(module).build(*args)


# name -> `build(model_config, input_spec) -> keras.Model`
BUILTINS = {name: _imported_on_first_use(module) for name, module in _MODULES.items()}
NAMES = tuple(BUILTINS)


def build(model_config: ml_collections.ConfigDict, input_spec):
  """A new built-in keras.Model (call inside `strategy.scope()` to distribute it)."""
  return BUILTINS[model_config.name](model_config, input_spec)


def single_input(name: str, input_spec):
  """The shape and dtype of a built-in model's one input; ModelError for dict features."""
  if isinstance(input_spec, dict):
    raise ModelError(f"model.name={name!r} takes one array of features, not a dict "
                     f"({', '.join(input_spec)}); use your own model (MODULE:FUNCTION)")
  return tuple(input_spec.shape[1:]), input_spec.dtype
