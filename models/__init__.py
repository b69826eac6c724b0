"""Model registry: `config.model.name` -> the `build(model_config)` of models/<name>.py.

Every builder returns an un-compiled Keras model that maps float32 images
[batch, 28, 28, 1] in [0, 1] to logits [batch, 10]. Layers carry explicit names,
so variable paths (and with them checkpoint keys) are the same in every process.
Builders are imported on first use: checking a config never imports Keras.
"""
import importlib

import ml_collections

_MODULES = {
    "mnist_cnn": "models.mnist_cnn",
    "mlp": "models.mlp",
}

NAMES = tuple(_MODULES)


def build(model_config: ml_collections.ConfigDict):
  """A new keras.Model for `model_config` (call inside `strategy.scope()` to distribute it)."""
  return importlib.import_module(_MODULES[model_config.name]).build(model_config)
