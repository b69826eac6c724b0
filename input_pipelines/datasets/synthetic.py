"""Learnable MNIST-shaped data made from the seed alone: the offline default.

Each class is a fixed pattern of a few Gaussian blobs; an example is its class's
pattern shifted by up to 2 pixels, with random contrast and pixel noise. A CNN
separates the classes well above chance within a few hundred steps, yet no single
pixel gives the label away.
"""
import ml_collections
import numpy as np

from input_pipelines.datasets.splits import Splits

_MAX_SHIFT = 2
_BLOBS_PER_CLASS = 4


def build(data_config: ml_collections.ConfigDict, seed: int) -> Splits:
  templates = _shifted_templates(np.random.default_rng([seed, 0]))
  train_images, train_labels = _sample(templates, data_config.num_train_examples,
                                       np.random.default_rng([seed, 1]))
  test_images, test_labels = _sample(templates, data_config.num_eval_examples,
                                     np.random.default_rng([seed, 2]))
  return Splits(train_images, train_labels, test_images, test_labels)


def build_sources(data_config: ml_collections.ConfigDict, seed: int):
  return build(data_config, seed).sources("data.name='synthetic'")


def _shifted_templates(rng: np.random.Generator) -> np.ndarray:
  """float32 [10, shifts, shifts, 28, 28]: every class pattern at every shift."""
  ys, xs = np.mgrid[0:28, 0:28].astype(np.float32)
  centers = rng.uniform(7, 21, size=(10, _BLOBS_PER_CLASS, 2)).astype(np.float32)
  widths = rng.uniform(1.5, 3.5, size=(10, _BLOBS_PER_CLASS, 1, 1)).astype(np.float32)
  d2 = ((ys - centers[..., 0, None, None]) ** 2 + (xs - centers[..., 1, None, None]) ** 2)
  patterns = np.exp(-d2 / (2 * widths ** 2)).sum(axis=1)
  patterns /= patterns.max(axis=(1, 2), keepdims=True)
  shifts = range(-_MAX_SHIFT, _MAX_SHIFT + 1)
  return np.stack([np.stack([np.roll(patterns, (dy, dx), axis=(1, 2)) for dx in shifts], axis=1)
                   for dy in shifts], axis=1)


def _sample(templates: np.ndarray, n: int, rng: np.random.Generator):
  num_shifts = templates.shape[1]
  labels = rng.integers(0, 10, size=n)
  dy, dx = rng.integers(0, num_shifts, size=(2, n))
  contrast = rng.uniform(0.6, 1.0, size=(n, 1, 1)).astype(np.float32)
  noise = rng.normal(0.0, 0.2, size=(n, 28, 28)).astype(np.float32)
  images = np.clip(templates[labels, dy, dx] * contrast + noise, 0.0, 1.0)
  return (images * 255).round().astype(np.uint8), labels.astype(np.int64)
