"""Input pipeline registry: `config.data.name` -> a `build(data_config, seed) -> Splits`.

Pipelines only load data into memory (numpy, no TensorFlow), so bad files are
reported before the runtime starts. `input_pipelines.batching` turns Splits into
the tf.data streams the trainer consumes.
"""
from typing import Callable

import ml_collections

from input_pipelines import mnist, synthetic
from input_pipelines.errors import DataError
from input_pipelines.splits import Splits

_BUILDERS: dict[str, Callable[[ml_collections.ConfigDict, int], Splits]] = {
    "synthetic": synthetic.build,
    "mnist": mnist.build_mnist,
    "fashion_mnist": mnist.build_fashion_mnist,
}

NAMES = tuple(_BUILDERS)

__all__ = ["DataError", "NAMES", "Splits", "load"]


def load(data_config: ml_collections.ConfigDict, seed: int) -> Splits:
  return _BUILDERS[data_config.name](data_config, seed)
