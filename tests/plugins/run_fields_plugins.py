"""A Task with a config section of its own (`own`) and its own optimizer, whose learning
rate the Task lets change on resume while `own.width` fixes the run
(tests/setup/test_run_fixing_fields.py). Also a config file: --config=tests/plugins/run_fields_plugins.py."""
import os

import keras

import trainer
from tests.plugins import plain_step
from configs import synthetic


class OwnLearningRate(trainer.Task):
  run_fixing_fields = {"own": ("width",)}

  def build(self, context):
    own = context.config.own
    self.model = keras.Sequential([keras.Input((28, 28, 1)), keras.layers.Flatten(),
                                   keras.layers.Dense(own.width), keras.layers.Dense(10)],
                                  name="tiny")
    self.optimizer = keras.optimizers.SGD(own.learning_rate)
    self.optimizer.build(self.model.trainable_variables)

  def train_step(self, batch, step):
    return plain_step.cross_entropy_step(self.model, self.optimizer, batch, step)


class DeclaresNothing(OwnLearningRate):
  run_fixing_fields = None


def get_config():
  config = synthetic.get_config()
  config.unlock()
  config.train.task = f"{os.path.abspath(__file__)}:OwnLearningRate"
  config.train.steps, config.train.steps_per_loop = 2, 2
  config.train.global_batch_size = 16
  config.data.num_train_examples, config.data.num_eval_examples = 64, 32
  config.own = dict(width=4, learning_rate=0.1)
  return config
