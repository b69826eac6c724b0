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

Where things live: the core stream here at the top (sources, order, batching,
padding, buckets, memory; errors, autograph_scope, native_output, read_log), the
built-in datasets in input_pipelines/datasets/, the records format and its
converter in input_pipelines/records/ (`python -m input_pipelines.convert`).
datasets/ imports the core, records/ imports both, the core neither (tests/docs/test_layout.py).
"""
import importlib

from input_pipelines.errors import DataError
from input_pipelines.sources import Source, StreamSource, as_splits

_MODULES = {  # name -> (module, function); imported on first use
    "synthetic": ("input_pipelines.datasets.synthetic", "build_sources"),
    "mnist": ("input_pipelines.datasets.mnist", "build_mnist_sources"),
    "fashion_mnist": ("input_pipelines.datasets.mnist", "build_fashion_mnist_sources"),
    "tabular": ("input_pipelines.datasets.table", "build_tabular"),
    "regression": ("input_pipelines.datasets.table", "build_regression"),
    "image_folder": ("input_pipelines.datasets.image_folder", "build"),
    "records": ("input_pipelines.records.records", "build"),
    "recommender": ("input_pipelines.datasets.recommender", "build"),
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
