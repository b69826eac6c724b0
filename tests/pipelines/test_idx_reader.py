"""The IDX reader on the real MNIST test files in ../shared/data/mnist, and on broken files."""
import gzip
import os
import shutil

import numpy as np
import pytest

from input_pipelines import DataError
from input_pipelines.datasets import idx
from input_pipelines.datasets import mnist
from tests.support.cli import FASHION_MNIST_DIR, MNIST_TEST_DIR

# Published facts about the MNIST test set: its first labels and its class counts.
FIRST_TEST_LABELS = [7, 2, 1, 0, 4, 1, 4, 9, 5, 9]
TEST_CLASS_COUNTS = [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]


def test_reads_real_mnist_test_set():
  images = idx.read_idx(os.path.join(MNIST_TEST_DIR, "t10k-images-idx3-ubyte.gz"))
  labels = idx.read_idx(os.path.join(MNIST_TEST_DIR, "t10k-labels-idx1-ubyte.gz"))
  assert images.shape == (10_000, 28, 28) and images.dtype == np.uint8
  assert labels.shape == (10_000,)
  assert labels[:10].tolist() == FIRST_TEST_LABELS
  assert np.bincount(labels).tolist() == TEST_CLASS_COUNTS
  # Digits are drawn in the middle: the border is blank, the centre is not.
  assert images[:, 0, :].max() == 0 and images[:, 14, 14].mean() > 50


def test_reads_real_mnist_training_labels():
  labels = idx.read_idx(os.path.join(MNIST_TEST_DIR, "train-labels-idx1-ubyte.gz"))
  assert labels.shape == (60_000,) and labels.max() == 9


def test_plain_and_gzipped_files_read_the_same(tmp_path):
  source = os.path.join(MNIST_TEST_DIR, "t10k-labels-idx1-ubyte.gz")
  plain = tmp_path / "t10k-labels-idx1-ubyte"
  with gzip.open(source) as f:
    plain.write_bytes(f.read())
  np.testing.assert_array_equal(idx.read_idx(str(plain)), idx.read_idx(source))


def test_fashion_mnist_directory_loads():
  class Config:
    dir = FASHION_MNIST_DIR
  splits = mnist.build_fashion_mnist(Config, seed=0)
  assert splits.train_images.shape == (60_000, 28, 28)
  assert splits.test_images.shape == (10_000, 28, 28)
  assert sorted(set(splits.test_labels.tolist())) == list(range(10))


def test_npz_directory_loads(tmp_path):
  rng = np.random.default_rng(0)
  np.savez(tmp_path / "mnist.npz",
           x_train=rng.integers(0, 255, (50, 28, 28), dtype=np.uint8), y_train=rng.integers(0, 10, 50),
           x_test=rng.integers(0, 255, (20, 28, 28), dtype=np.uint8), y_test=rng.integers(0, 10, 20))

  class Config:
    dir = str(tmp_path)
  splits = mnist.build_mnist(Config, seed=0)
  assert splits.train_images.shape == (50, 28, 28) and splits.test_labels.shape == (20,)


@pytest.mark.parametrize("damage, message", [
    (lambda raw: raw[: len(raw) // 2], "truncated or padded"),
    (lambda raw: raw + b"\0" * 7, "truncated or padded"),
    (lambda raw: b"\x12\x34" + raw[2:], "bad magic"),
    (lambda raw: raw[:6], "truncated IDX header"),
])
def test_broken_files_name_the_file(tmp_path, damage, message):
  with gzip.open(os.path.join(MNIST_TEST_DIR, "t10k-labels-idx1-ubyte.gz")) as f:
    raw = f.read()
  path = tmp_path / "t10k-labels-idx1-ubyte"
  path.write_bytes(damage(raw))
  with pytest.raises(DataError, match=message) as error:
    idx.read_idx(str(path))
  assert str(path) in str(error.value)


def test_truncated_gzip_names_the_file(tmp_path):
  path = tmp_path / "t10k-images-idx3-ubyte.gz"
  raw = open(os.path.join(MNIST_TEST_DIR, "t10k-images-idx3-ubyte.gz"), "rb").read()
  path.write_bytes(raw[:5000])
  with pytest.raises(DataError, match="corrupt or truncated gzip") as error:
    idx.read_idx(str(path))
  assert str(path) in str(error.value)


def test_mismatched_image_and_label_counts(tmp_path):
  for name in os.listdir(MNIST_TEST_DIR):
    if name.endswith(".gz"):
      shutil.copy(os.path.join(MNIST_TEST_DIR, name), tmp_path / name)
  # The real training labels (60,000) beside test images used as training images (10,000).
  shutil.copy(os.path.join(MNIST_TEST_DIR, "t10k-images-idx3-ubyte.gz"),
              tmp_path / "train-images-idx3-ubyte.gz")

  class Config:
    dir = str(tmp_path)
  with pytest.raises(DataError, match="10000 images but 60000 labels"):
    mnist.build_mnist(Config, seed=0)


def test_missing_file_is_named(tmp_path):
  class Config:
    dir = str(tmp_path)
  with pytest.raises(DataError, match="train-images-idx3-ubyte"):
    mnist.build_mnist(Config, seed=0)
