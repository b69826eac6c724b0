"""Your own images in class folders: data.dir/train/<class>/<image> (and test/).

The seed CNN on images decoded from disk as it trains, so they need not fit in
memory. The model has one logit per class folder in train/ (model.num_classes=0:
from the data; a value given is checked against the folders):

  python -m trainer --config=image_folder --model_dir=/tmp/distloop/flowers \
      --config.data.dir=/data/flowers

Without a test/ folder, data.eval_fraction of every class is held out (chosen
by runtime.seed). Any image size is resized to data.image_size squared.
"""
import ml_collections

from configs import common


def get_config() -> ml_collections.ConfigDict:
  config = common.base_config()
  config.model.name = "mnist_cnn"      # takes any [H, W, C]; num_classes logits
  config.model.num_classes = 0         # 0: the number of class folders in data.dir/train
  config.data.name = "image_folder"
  config.data.dir = ""                 # required: holds train/<class>/ (and test/<class>/)
  config.data.image_size = 32          # every image resized to 32 x 32 (bilinear)
  config.data.channels = 3             # 3: RGB; 1: grayscale
  config.data.eval_fraction = 0.2      # held-out share of train/ when there is no test/
  config.train.steps = 1000            # about 20 epochs of 3,000 images at batch 64
  config.train.global_batch_size = 64
  config.train.learning_rate = 1e-3
  config.eval.metrics = "accuracy"
  config.lock()
  return config
