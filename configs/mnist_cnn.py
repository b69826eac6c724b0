"""The seed CNN on MNIST for two epochs at batch 64 (60,000 / 64 * 2 = 1875 steps).

  python -m trainer --config=mnist_cnn --model_dir=/tmp/distloop/mnist
  # offline, from the four IDX files, e.g. Debian's Fashion-MNIST:
  python -m trainer --config=mnist_cnn --model_dir=/tmp/distloop/fashion \
      --config.data.name=fashion_mnist --config.data.dir=/usr/share/datasets/fashion-mnist
"""
import ml_collections

from configs import common


def get_config() -> ml_collections.ConfigDict:
  config = common.base_config()
  config.model.name = "mnist_cnn"
  config.data.name = "mnist"
  config.data.dir = ""
  config.train.steps = 1875
  config.train.global_batch_size = 64
  config.train.steps_per_loop = 125
  config.train.optimizer = "adam"
  config.train.learning_rate = 1e-3
  config.eval.interval = 625
  config.checkpoint.interval = 625
  config.lock()
  return config
