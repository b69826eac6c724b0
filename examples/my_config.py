"""A user's config file: distloop's defaults, this project's plug-ins and two fields of its own.

  python -m trainer --config=examples/my_config.py --model_dir=/tmp/distloop/spirals

Plug-ins are named MODULE:FUNCTION; MODULE here is the path of my_project.py next
to this file, so the example runs from anywhere, with no install.
"""
import os

from configs import common

_PROJECT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "my_project.py")


def get_config():
  config = common.base_config()
  config.model.name = f"{_PROJECT}:build_model"
  config.model.width = 64              # this project's own field: units per hidden layer
  config.model.depth = 2               # this project's own field: hidden layers
  config.data.name = f"{_PROJECT}:build_data"
  config.data.num_train_examples = 20_000
  config.data.num_eval_examples = 2_000
  config.train.loss = "sparse_categorical_crossentropy"
  config.train.steps = 600
  config.train.global_batch_size = 64
  config.train.learning_rate = 0.01
  config.eval.metrics = f"accuracy,{_PROJECT}:confident_accuracy"
  config.lock()
  return config
