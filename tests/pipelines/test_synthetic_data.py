"""The offline default data: deterministic in the seed and MNIST-shaped."""
import numpy as np

from configs import synthetic as synthetic_config
from input_pipelines.datasets import synthetic


def _data_config():
  return synthetic_config.get_config().data


def test_same_seed_same_data_other_seed_other_data():
  a, b = synthetic.build(_data_config(), seed=3), synthetic.build(_data_config(), seed=3)
  c = synthetic.build(_data_config(), seed=4)
  np.testing.assert_array_equal(a.train_images, b.train_images)
  np.testing.assert_array_equal(a.test_labels, b.test_labels)
  assert not np.array_equal(a.train_images, c.train_images)


def test_shapes_and_balance():
  config = _data_config()
  splits = synthetic.build(config, seed=0)
  assert splits.train_images.shape == (config.num_train_examples, 28, 28)
  assert splits.train_images.dtype == np.uint8
  assert splits.test_images.shape == (config.num_eval_examples, 28, 28)
  counts = np.bincount(splits.train_labels, minlength=10)
  assert counts.min() > 0.8 * counts.mean()
  splits.check("synthetic")


def test_no_single_pixel_gives_the_label_away():
  """Learnable, but not trivially: a nearest-class-mean on raw pixels is imperfect."""
  splits = synthetic.build(_data_config(), seed=0)
  x = splits.train_images.reshape(len(splits.train_labels), -1).astype(np.float32)
  means = np.stack([x[splits.train_labels == k].mean(0) for k in range(10)])
  test = splits.test_images.reshape(len(splits.test_labels), -1).astype(np.float32)
  predictions = ((test[:, None, :] - means[None]) ** 2).sum(-1).argmin(1)
  accuracy = (predictions == splits.test_labels).mean()
  assert 0.3 < accuracy < 0.999
