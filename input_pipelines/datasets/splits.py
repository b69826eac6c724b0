"""The MNIST family's in-memory form: 28x28 uint8 images and labels 0..9."""
import dataclasses

import numpy as np

from input_pipelines.errors import DataError
from input_pipelines.sources import ArraySource


def scale_images(images):
  """uint8 [b, 28, 28] -> float32 [b, 28, 28, 1] in [0, 1], per batch in tf.data."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top  (the pipeline runs it)
  return tf.cast(images, tf.float32)[..., tf.newaxis] / 255.0


@dataclasses.dataclass(frozen=True)
class Splits:
  """uint8 images [N, 28, 28] and int64 labels [N] in 0..9, for train and test."""
  train_images: np.ndarray
  train_labels: np.ndarray
  test_images: np.ndarray
  test_labels: np.ndarray

  def check(self, source: str) -> "Splits":
    """Raises DataError (naming `source`) unless shapes, dtypes and labels are sane."""
    for split, images, labels in (("train", self.train_images, self.train_labels),
                                  ("test", self.test_images, self.test_labels)):
      if images.ndim != 3 or images.shape[1:] != (28, 28):
        raise DataError(f"{source}: {split} images have shape {images.shape}, expected [N, 28, 28]")
      if labels.shape != (images.shape[0],):
        raise DataError(f"{source}: {split} has {images.shape[0]} images but "
                        f"{labels.shape[0] if labels.ndim else 0} labels")
      if images.shape[0] == 0:
        raise DataError(f"{source}: the {split} split is empty")
      if labels.min() < 0 or labels.max() > 9:
        raise DataError(f"{source}: {split} labels outside 0..9")
    return self

  def sources(self, where: str) -> tuple[ArraySource, ArraySource]:
    """(train, eval) as the pipeline reads them; the serving input is named `images`."""
    return (ArraySource(self.train_images, self.train_labels, where=f"{where} train split",
                        decode=scale_images, feature_name="images", num_classes=10),
            ArraySource(self.test_images, self.test_labels, where=f"{where} eval split",
                        decode=scale_images, feature_name="images", num_classes=10))
