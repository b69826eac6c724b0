"""Model parallelism's example: a ~100 MB user embedding table split over 2 parameter
servers, trained by 2 workers (README: "Model parallelism on TensorFlow 2.21 + Keras 3"):

  python -m trainer.launch --num_workers=2 --num_ps=2 -- \
      --config=recommender --model_dir=/tmp/distloop/recommender

Users 200,000 x 128 floats (~100 MB) and items 1,000 x 128; every table of 1 MB or
more is split (min_size:1048576), one shard per server. Plain SGD: its update of an
embedding is sparse (only the rows a batch looked up), where Adam's would rewrite the
whole table and its two slots every step. At this size it shows scale, not accuracy
(README: measured); the learnable, tested setting is 1,000 users x 16
(tests/test_sharded_variables.py).
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
  config.data.num_train_examples = 400_000
  config.data.num_eval_examples = 10_000
  config.runtime.strategy = "parameter_server"
  config.runtime.variable_partitioner = "min_size:1048576"
  config.train.optimizer = "sgd"
  config.train.learning_rate = 5.0
  config.train.global_batch_size = 512
  config.train.steps = 2_000
  config.train.steps_per_loop = 50
  config.checkpoint.interval = 500
  config.eval.interval = 500
  config.lock()
  return config
