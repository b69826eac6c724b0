"""The embedded default: the seed CNN on learnable synthetic MNIST-shaped data.

Runs offline in well under a minute on a laptop CPU and reaches >= 0.95 eval accuracy:

  python -m trainer --config=synthetic --model_dir=/tmp/distloop/synthetic
"""
import ml_collections

from configs import common


def get_config() -> ml_collections.ConfigDict:
  config = common.base_config()
  config.data.name = "synthetic"
  config.train.steps = 300
  config.train.global_batch_size = 64
  config.train.learning_rate = 1e-3
  config.lock()
  return config
