"""A user's job that records the rows each replica's step read, as a user hunting a loss
spike would (tests/verify/test_inspect.py compares them with `python -m trainer.inspect`):
each example carries its row's index; the step writes (step, replica, indices) to the
file RECORDED_ROWS names."""
import json
import os

import keras
import numpy as np
import tensorflow as tf

import trainer

ROWS = 200  # not a multiple of the batch: epochs end mid-batch


def _examples(n: int, seed: int):
  rng = np.random.default_rng(seed)
  labels = (np.arange(n) % 10).astype(np.int64)
  return ({"image": rng.random((n, 28, 28, 1)).astype(np.float32),
           "index": np.arange(n, dtype=np.int64)}, labels)


def indexed(data_config, seed):
  return _examples(ROWS, seed), _examples(40, seed + 1)


class RecordsItsRows(trainer.Task):

  def build(self, context):
    self.model = keras.Sequential([keras.Input((28, 28, 1)), keras.layers.Flatten(),
                                   keras.layers.Dense(10)], name="tiny")
    self.optimizer = context.optimizer(self.model.trainable_variables)

  def train_step(self, batch, step):
    features, labels = batch
    replica = tf.distribute.get_replica_context().replica_id_in_sync_group
    tf.numpy_function(_record, [self.optimizer.iterations + 1, replica, features["index"]],
                      tf.int64, stateful=True)
    with tf.GradientTape() as tape:
      per_example = keras.losses.sparse_categorical_crossentropy(
          labels, self.model(features["image"]), from_logits=True)
      loss = step.replica_loss(per_example)
    step.minimize(self.optimizer, tape, loss, self.model.trainable_variables)
    return {"loss": per_example}


def _record(step, replica, rows):
  with open(os.environ["RECORDED_ROWS"], "a") as f:
    f.write(json.dumps({"step": int(step), "replica": int(replica),
                        "rows": [int(row) for row in rows]}) + "\n")
  return np.int64(0)
