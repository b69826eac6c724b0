"""Images in class folders, decoded on demand: data that need not fit in memory.

Layout (png, jpg or jpeg; extensions in any case):

  data.dir/train/<class>/<image>
  data.dir/test/<class>/<image>     optional

Classes are the sorted subfolder names of train/, label ids 0..C-1 (int64);
test/ may hold a subset of them. Without test/, a share `data.eval_fraction`
of every class of train/ is held out, chosen by a permutation from the seed (so
the held-out images change with runtime.seed). Other files, hidden files and
folders (`.DS_Store`, macOS `._x.jpg`) and anything nested deeper are ignored;
a class folder without any image is an error.

Who owns what: `build` runs before TensorFlow starts and only lists files, so a
wrong layout is one line naming the folder. An `ImageFolderSource` says what
example k is: `source[indices]` opens, converts (RGB or L), resizes (bilinear)
and scales those files alone to float32 [b, size, size, channels] in [0, 1].
distloop owns the order, batching, parallel reads (it calls `__getitem__` from
several tf.data threads: each call touches only its own files and arrays) and
prefetch. A file that cannot be decoded is a DataError naming it.
"""
import os

import ml_collections
import numpy as np
from PIL import Image

from input_pipelines.datasets import option_names
from input_pipelines.errors import DataError

EXTENSIONS = (".png", ".jpg", ".jpeg")
_MODES = {1: "L", 3: "RGB"}  # data.channels -> Pillow mode


class ImageFolderSource:
  """A random-access split: `paths[k]` is example k, `labels[k]` its class id.

  `classes` names the label ids (the train folder's classes, also on the eval
  split); `feature_name` is the SavedModel's input name.
  """
  feature_name = "images"

  def __init__(self, paths: list[str], labels: np.ndarray, classes: list[str], *,
               image_size: int, channels: int):
    self.paths = paths
    self.labels = np.asarray(labels, dtype=np.int64)
    self.classes = classes
    self.image_size = image_size
    self.channels = channels

  def __len__(self) -> int:
    return len(self.paths)

  def __getitem__(self, indices: np.ndarray):
    indices = np.asarray(indices, dtype=np.int64)
    size = self.image_size
    images = np.empty((len(indices), size, size, self.channels), dtype=np.float32)
    for row, index in enumerate(indices):
      images[row] = decode(self.paths[index], size, self.channels)
    return images, self.labels[indices]


def decode(path: str, size: int, channels: int) -> np.ndarray:
  """One file -> float32 [size, size, channels] in [0, 1]; DataError naming it otherwise."""
  try:
    with Image.open(path) as image:
      if image.mode.startswith("I"):  # 16/32-bit grayscale: convert("L") would saturate
        image = image.convert("F")
        scale = 65535.0
      else:
        image.draft(_MODES[channels], (size, size))  # JPEG only: decode at a reduced scale
        image = image.convert(_MODES[channels])
        scale = 255.0
      if image.size != (size, size):
        image = image.resize((size, size), Image.Resampling.BILINEAR)
      pixels = np.asarray(image, dtype=np.float32) / scale
  except Exception as e:  # pylint: disable=broad-except  (Pillow raises many kinds)
    raise DataError(f"{path}: cannot be decoded as an image "
                    f"({type(e).__name__}: {str(e).strip()[:200]})") from None
  if pixels.ndim == 2:
    pixels = pixels[..., np.newaxis]
  if pixels.shape[-1] != channels:  # a 16-bit grayscale file read as RGB
    pixels = np.repeat(pixels, channels, axis=-1)
  return np.clip(pixels, 0.0, 1.0)


def build(data_config: ml_collections.ConfigDict, seed: int, names=option_names.CONFIG
          ) -> tuple[ImageFolderSource, ImageFolderSource]:
  """(train, eval) sources from `data.dir`; lists files, decodes none; messages name the
  options as `names` spells them."""
  size, channels = _check_fields(data_config, names)
  root = os.path.expanduser(data_config.dir)
  folder = names["dir"]
  if not root:
    raise DataError(f"{folder}: empty; image_folder reads {folder}/train/<class>/<image>")
  if not os.path.isdir(root):
    raise DataError(f"{root}: no such folder ({folder})")
  train_dir = os.path.join(root, "train")
  if not os.path.isdir(train_dir):
    raise DataError(f"{train_dir}: no such folder; image_folder reads "
                    f"{folder}/train/<class>/<image> (and {folder}/test/<class>/<image>)")
  classes = _class_folders(train_dir)
  paths, labels = _list_images(train_dir, classes, classes)

  test_dir = os.path.join(root, "test")
  if os.path.isdir(test_dir):
    test_classes = _class_folders(test_dir)
    unknown = [name for name in test_classes if name not in classes]
    if unknown:
      raise DataError(f"{os.path.join(test_dir, unknown[0])}: class {unknown[0]!r} is not a "
                      f"class of train/ ({_names(classes)})")
    train_paths, train_labels = paths, labels
    eval_paths, eval_labels = _list_images(test_dir, test_classes, classes)
  elif os.path.exists(test_dir):
    raise DataError(f"{test_dir}: not a folder; test/ holds <class>/<image> like train/")
  else:
    eval_share = _held_out(labels, data_config.eval_fraction, seed, train_dir,
                           names["eval_fraction"])
    train_paths = [p for p, held in zip(paths, eval_share) if not held]
    eval_paths = [p for p, held in zip(paths, eval_share) if held]
    train_labels, eval_labels = labels[~eval_share], labels[eval_share]

  return (ImageFolderSource(train_paths, train_labels, classes, image_size=size, channels=channels),
          ImageFolderSource(eval_paths, eval_labels, classes, image_size=size, channels=channels))


def _check_fields(data_config, names) -> tuple[int, int]:
  size, channels = data_config.image_size, data_config.channels
  if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
    raise DataError(f"{names['image_size']}={size!r}: must be a positive integer (pixels per "
                    f"side)")
  if channels not in _MODES or isinstance(channels, bool):
    raise DataError(f"{names['channels']}={channels!r}: must be 3 (RGB) or 1 (grayscale)")
  return size, channels


def _visible(name: str) -> bool:
  return not name.startswith(".")


def _class_folders(split_dir: str) -> list[str]:
  """Sorted names of the visible subfolders; DataError if there are none."""
  with os.scandir(split_dir) as entries:
    names = sorted(e.name for e in entries if e.is_dir() and _visible(e.name))
  if not names:
    raise DataError(f"{split_dir}: no class subfolders; expected {split_dir}/<class>/<image>")
  return names


def _list_images(split_dir: str, names: list[str], classes: list[str]
                 ) -> tuple[list[str], np.ndarray]:
  """Paths (sorted by class, then file name) and their label ids in `classes`."""
  paths, labels = [], []
  for name in names:
    folder = os.path.join(split_dir, name)
    with os.scandir(folder) as entries:
      files = sorted(e.name for e in entries
                     if _visible(e.name) and e.name.lower().endswith(EXTENSIONS) and e.is_file())
    if not files:
      raise DataError(f"{folder}: no images (png, jpg or jpeg) in this class folder")
    paths.extend(os.path.join(folder, f) for f in files)
    labels.extend([classes.index(name)] * len(files))
  return paths, np.asarray(labels, dtype=np.int64)


def _held_out(labels: np.ndarray, fraction: float, seed: int, train_dir: str,
              field: str) -> np.ndarray:
  """Boolean mask: a seeded `fraction` of every class (at least one image of each stays)."""
  if not 0.0 < fraction < 1.0:
    raise DataError(f"{field}={fraction!r}: must be between 0 and 1 (exclusive) "
                    f"when {os.path.dirname(train_dir)} has no test/ folder")
  rng = np.random.default_rng([seed, 0x1F01DE2])  # this pipeline's own stream of the seed
  mask = np.zeros(len(labels), dtype=bool)
  for label in np.unique(labels):
    members = np.flatnonzero(labels == label)
    count = min(int(round(fraction * len(members))), len(members) - 1)
    mask[rng.permutation(members)[:count]] = True
  if not mask.any():
    raise DataError(f"{train_dir}: {field}={fraction} of {len(labels)} images holds "
                    f"out none; raise it or add a test/ folder")
  return mask


def _names(classes: list[str]) -> str:
  shown = ", ".join(classes[:10])
  return shown + (f", ... {len(classes)} in all" if len(classes) > 10 else "")
