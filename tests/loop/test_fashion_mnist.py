"""The seed CNN on real Fashion-MNIST (Debian's dataset-fashion-mnist) through the CLI."""
import csv
import json

import pytest

from tests.support.cli import FASHION_MNIST_DIR, run_python, train_ok

pytestmark = pytest.mark.slow  # python -m pytest -m slow (CI runs these too)


@pytest.fixture(scope="module")
def fashion_run(tmp_path_factory):
  model_dir = tmp_path_factory.mktemp("fashion")
  summary = train_ok(model_dir, "--config=mnist_cnn", "--config.data.name=fashion_mnist",
                     f"--config.data.dir={FASHION_MNIST_DIR}")
  return model_dir, summary


def test_two_epochs_at_batch_64_reach_088(fashion_run):
  _, summary = fashion_run
  assert summary["step"] == 1875  # 2 epochs of 60,000 at batch 64
  assert summary["eval_examples"] == 10_000
  assert summary["eval_accuracy"] >= 0.88


def test_saved_model_agrees_with_eval_accuracy(fashion_run):
  """The export, loaded with plain TensorFlow, scores the same test set the same way."""
  model_dir, summary = fashion_run
  code = f"""
import gzip, json, numpy as np, tensorflow as tf

def idx(name):
  raw = gzip.open('{FASHION_MNIST_DIR}/' + name).read()
  ndim = raw[3]
  shape = np.frombuffer(raw, '>i4', ndim, 4)
  return np.frombuffer(raw, np.uint8, offset=4 + 4 * ndim).reshape(shape)
images = idx('t10k-images-idx3-ubyte.gz').astype(np.float32)[..., None] / 255.0
labels = idx('t10k-labels-idx1-ubyte.gz')
serve = tf.saved_model.load('{model_dir}/export/1875').signatures['serving_default']
probabilities = np.concatenate([serve(images=tf.constant(images[i:i + 1000]))['probabilities'].numpy()
                                for i in range(0, len(images), 1000)])
print(json.dumps({{'accuracy': float((probabilities.argmax(-1) == labels).mean())}}))
"""
  exported = json.loads(run_python(code).strip().splitlines()[-1])["accuracy"]
  assert abs(exported - summary["eval_accuracy"]) <= 0.005


def test_the_keras_tutorials_five_epochs_are_five_epochs(tmp_path):
  """The Keras classification tutorial's `epochs=5` at batch 32, as `train.epochs=5`:
  9,375 steps (5 x 60,000 / 32), the epoch reported as 5.00 at the end (metrics.csv),
  and the tutorial's accuracy."""
  summary = train_ok(tmp_path, "--config=mnist_cnn", "--config.model.name=mlp",
                     "--config.data.name=fashion_mnist", f"--config.data.dir={FASHION_MNIST_DIR}",
                     "--config.train.epochs=5", "--config.train.global_batch_size=32",
                     "--config.train.steps_per_loop=625")
  assert summary["step"] == 9375
  with open(tmp_path / "metrics.csv", newline="") as f:
    epochs = {int(row["step"]): float(row["value"]) for row in csv.DictReader(f)
              if row["split"] == "train" and row["name"] == "epoch"}
  assert epochs[9375] == 5.0 and epochs[1875] == 1.0
  assert summary["eval_accuracy"] >= 0.85
