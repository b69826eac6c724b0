"""`data.dir=""` goes through Keras's download/cache; faked here (no network in CI)."""
import keras
import numpy as np
import pytest

from input_pipelines import DataError
from input_pipelines.datasets import mnist


class _EmptyDir:
  dir = ""


def test_uses_keras_loader(monkeypatch):
  rng = np.random.default_rng(0)
  fake = ((rng.integers(0, 255, (30, 28, 28), dtype=np.uint8), rng.integers(0, 10, 30)),
          (rng.integers(0, 255, (12, 28, 28), dtype=np.uint8), rng.integers(0, 10, 12)))
  monkeypatch.setattr(keras.datasets.fashion_mnist, "load_data", lambda: fake)
  splits = mnist.build_fashion_mnist(_EmptyDir, seed=0)
  assert splits.train_images.shape == (30, 28, 28) and splits.test_labels.shape == (12,)


def test_download_failure_is_a_data_error(monkeypatch):
  def offline():
    raise Exception("URL fetch failure on https://example.invalid/mnist.npz")
  monkeypatch.setattr(keras.datasets.mnist, "load_data", offline)
  with pytest.raises(DataError, match="could not download mnist .*URL fetch failure.*data.dir"):
    mnist.build_mnist(_EmptyDir, seed=0)
