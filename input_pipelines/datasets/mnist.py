"""MNIST and Fashion-MNIST: from `data.dir` (IDX files or mnist.npz) or Keras's download cache."""
import os

import ml_collections
import numpy as np

from input_pipelines.datasets import idx
from input_pipelines.datasets.splits import Splits
from input_pipelines.errors import DataError

_IDX_STEMS = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte",
              "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")


def build_mnist(data_config: ml_collections.ConfigDict, seed: int) -> Splits:
  del seed  # the files fix the data; the seed only orders it (input_pipelines.batching)
  return _load(data_config.dir, "mnist")


def build_fashion_mnist(data_config: ml_collections.ConfigDict, seed: int) -> Splits:
  del seed
  return _load(data_config.dir, "fashion_mnist")


def build_mnist_sources(data_config: ml_collections.ConfigDict, seed: int):
  return build_mnist(data_config, seed).sources("data.name='mnist'")


def build_fashion_mnist_sources(data_config: ml_collections.ConfigDict, seed: int):
  return build_fashion_mnist(data_config, seed).sources("data.name='fashion_mnist'")


def load_files(path: str) -> Splits:
  """The MNIST family from files alone (the converter's input): a folder of the four IDX
  files, a folder holding one `*mnist.npz`, or such an .npz file itself."""
  if os.path.isfile(path) and path.endswith(".npz"):
    return _load_npz(path)
  if not os.path.isdir(path):
    raise DataError(f"{path}: not a folder of IDX files nor an .npz file")
  npz = sorted(f for f in os.listdir(path) if f.endswith("mnist.npz"))
  if len(npz) > 1:
    raise DataError(f"{path}: holds {' and '.join(npz)}; name one of them")
  return _load_npz(os.path.join(path, npz[0])) if npz else _load(path, "mnist")


def _load(directory: str, name: str) -> Splits:
  if not directory:
    return _load_with_keras(name)
  if not os.path.isdir(directory):
    raise DataError(f"data.dir {directory!r} does not exist or is not a directory")
  npz = os.path.join(directory, f"{name}.npz")
  if os.path.isfile(npz):
    return _load_npz(npz)
  paths = [idx.find_idx_file(directory, stem) for stem in _IDX_STEMS]
  arrays = [idx.read_idx(p) for p in paths]
  source = f"IDX files in {directory}"
  return Splits(arrays[0], arrays[1].astype(np.int64),
                arrays[2], arrays[3].astype(np.int64)).check(source)


def _load_npz(path: str) -> Splits:
  try:
    with np.load(path) as f:
      arrays = [f[k] for k in ("x_train", "y_train", "x_test", "y_test")]
  except (OSError, ValueError, KeyError, EOFError) as e:
    raise DataError(f"{path}: cannot read ({e})") from None
  return Splits(arrays[0].astype(np.uint8), arrays[1].astype(np.int64),
                arrays[2].astype(np.uint8), arrays[3].astype(np.int64)).check(path)


def _load_with_keras(name: str) -> Splits:
  import keras  # pylint: disable=g-import-not-at-top  (only this path needs it)
  loader = {"mnist": keras.datasets.mnist, "fashion_mnist": keras.datasets.fashion_mnist}[name]
  try:
    (x_train, y_train), (x_test, y_test) = loader.load_data()
  except Exception as e:  # pylint: disable=broad-except  (network errors come in many types)
    raise DataError(
        f"could not download {name} with Keras ({str(e).splitlines()[0][:200] or type(e).__name__}); set "
        f"--config.data.dir to a folder with the four IDX files or {name}.npz") from None
  return Splits(x_train, y_train.astype(np.int64), x_test,
                y_test.astype(np.int64)).check(f"Keras {name} download")
