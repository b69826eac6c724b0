"""Input pipeline registry: `config.data.name` -> `(train, eval)` sources.

A built-in name maps to a builder here (`BUILTINS`); `MODULE:FUNCTION`, the
user's own, is resolved and called by trainer/setup/plugins.py (this package imports
nothing from trainer/). Every builder has the plug-in signature
`FUNCTION(data_config, seed) -> (train, eval)`, each split one of the forms
input_pipelines/sources.py accepts (numpy arrays, a random-access source, or a
callable returning a tf.data.Dataset). Builders run before the TensorFlow
runtime starts: they load or index data, they do not run TensorFlow ops, so bad
files are reported in a second. `input_pipelines.batching` turns the sources into
the tf.data streams the trainer consumes; it owns the order.
"""
import importlib

from input_pipelines.errors import DataError
from input_pipelines.sources import Source, StreamSource, as_splits

_MODULES = {  # name -> (module, function); imported on first use
    "synthetic": ("input_pipelines.synthetic", "build_sources"),
    "mnist": ("input_pipelines.mnist", "build_mnist_sources"),
    "fashion_mnist": ("input_pipelines.mnist", "build_fashion_mnist_sources"),
    "tabular": ("input_pipelines.table", "build_tabular"),
    "regression": ("input_pipelines.table", "build_regression"),
    "image_folder": ("input_pipelines.image_folder", "build"),
    "records": ("input_pipelines.records", "build"),
    "recommender": ("input_pipelines.recommender", "build"),
}


def _imported_on_first_use(module: str, function: str):
  return lambda *args: getattr(importlib.import_module(module), function)(*args)


# name -> `build(data_config, seed) -> (train, eval)`
BUILTINS = {name: _imported_on_first_use(*where) for name, where in _MODULES.items()}
NAMES = tuple(BUILTINS)

__all__ = ["BUILTINS", "DataError", "NAMES", "Source", "StreamSource", "as_splits",
           "num_classes"]


def num_classes(train: Source, evaluation: Source) -> tuple[int, str] | None:
  """How many classes the data has (model.num_classes=0 takes it from here) and what says
  so: image_folder's class folders, the MNIST family's 10, else the largest integer
  label of both splits + 1. None if the data cannot say (float labels, a tf.data stream)."""
  counts = [count for count in (train.class_count(), evaluation.class_count()) if count]
  return max(counts, key=lambda count: count[0]) if counts else None
