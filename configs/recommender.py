"""Model parallelism's example: a ~100 MB user embedding table split over 2 parameter
servers, trained by 2 workers (README: "Model parallelism on TensorFlow 2.21 + Keras 3"):

  python -m trainer.launch --num_workers=2 --num_ps=2 -- \\
      --config=recommender --model_dir=/tmp/distloop/recommender

Users 50,000 x 512 floats (~100 MB) and items 1,000 x 512; every table of 1 MB or more
is split (min_size:1048576), one shard per server. 1,000,000 clicks (20 per user), 3
epochs. Plain SGD: its update of an embedding is sparse (only the rows a batch looked
up), where Adam's would rewrite the whole table and its two slots every step. Its rate
is large because the loss is a mean over the batch and a user's row is in ~1 of its
2,048 examples: 320 moves a row by ~0.16 x its one example's gradient; 640 learned
faster but overfit and once diverged (README: measured).
"""
import ml_collections

from configs import common


def get_config() -> ml_collections.ConfigDict:
  config = common.base_config()
  config.model.name = "recommender"
  config.data.name = "recommender"
  with config.unlocked():  # the tables' rows are the data's ids (a reference: set data.*)
    config.model.num_users = config.data.get_ref("num_users")
    config.model.num_items = config.data.get_ref("num_items")
  config.data.num_train_examples = 1_000_000
  config.data.num_eval_examples = 10_000
  config.runtime.strategy = "parameter_server"
  config.runtime.variable_partitioner = "min_size:1048576"
  config.train.optimizer = "sgd"
  config.train.learning_rate = 320.0
  config.train.global_batch_size = 2048
  config.train.steps = 1_500
  config.train.steps_per_loop = 50
  config.checkpoint.interval = 500
  config.eval.interval = 500
  config.lock()
  return config
