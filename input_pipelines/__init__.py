"""Input pipeline registry: `config.data.name` -> `(train, eval)` sources.

A built-in name maps to a builder here; `MODULE:FUNCTION` names the user's own
(trainer/plugins.py). Every builder has the plug-in signature
`FUNCTION(data_config, seed) -> (train, eval)`, each split one of the forms
input_pipelines/sources.py accepts (numpy arrays, a random-access source, or a
callable returning a tf.data.Dataset). Builders run before the TensorFlow
runtime starts: they load or index data, they do not run TensorFlow ops, so bad
files are reported in a second. `input_pipelines.batching` turns the sources into
the tf.data streams the trainer consumes; it owns the order.
"""
import importlib

import ml_collections

from input_pipelines import sources
from input_pipelines.errors import DataError
from input_pipelines.sources import Source, StreamSource
from trainer import plugins

_BUILTINS = {  # name -> (module, function); imported on first use
    "synthetic": ("input_pipelines.synthetic", "build_sources"),
    "mnist": ("input_pipelines.mnist", "build_mnist_sources"),
    "fashion_mnist": ("input_pipelines.mnist", "build_fashion_mnist_sources"),
    "tabular": ("input_pipelines.table", "build_tabular"),
    "regression": ("input_pipelines.table", "build_regression"),
    "image_folder": ("input_pipelines.image_folder", "build"),
    "records": ("input_pipelines.records", "build"),
}

NAMES = tuple(_BUILTINS)

__all__ = ["DataError", "NAMES", "Source", "StreamSource", "builder", "load", "num_classes"]


def builder(data_config: ml_collections.ConfigDict):
  """The builder `data.name` names; UserError if it does not resolve."""
  if data_config.name in _BUILTINS:
    module, function = _BUILTINS[data_config.name]
    return getattr(importlib.import_module(module), function)
  return plugins.resolve("data.name", data_config.name, dict.fromkeys(NAMES))


def load(data_config: ml_collections.ConfigDict, seed: int) -> tuple[Source, Source]:
  """(train, eval) sources, checked: DataError/UserError naming the plug-in otherwise."""
  build = builder(data_config)
  try:
    splits = build(data_config, seed)
  except (DataError, plugins.UserError):
    raise
  except SystemExit as e:  # a plug-in ending the process would end the run with its code
    raise plugins.UserError(f"data.name={data_config.name!r} called sys.exit({e.code!r}); a "
                            f"data builder must return (train, eval) or raise") from None
  except Exception as e:  # pylint: disable=broad-except  (user code raises anything)
    if data_config.name in _BUILTINS:
      raise
    raise plugins.UserError(f"data.name={data_config.name!r} raised {type(e).__name__}: "
                            f"{str(e).strip().splitlines()[0][:300] if str(e).strip() else ''}"
                            ) from None
  return sources.as_splits(splits, f"data.name={data_config.name!r}")


def num_classes(train: Source, evaluation: Source) -> tuple[int, str] | None:
  """How many classes the data has (model.num_classes=0 takes it from here) and what says
  so: image_folder's class folders, the MNIST family's 10, else the largest integer
  label of both splits + 1. None if the data cannot say (float labels, a tf.data stream)."""
  counts = [count for count in (train.class_count(), evaluation.class_count()) if count]
  return max(counts, key=lambda count: count[0]) if counts else None
