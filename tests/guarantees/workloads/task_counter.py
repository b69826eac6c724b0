"""A Task's own variables: a step counter and moving averages the step assigns.

`Counter` is tests/plugins/task_plugins.py's WithEma (a step counter and moving averages,
tf.Variables the step assigns) with an eval step and an export, so that every check of
the matrix applies to it."""
import keras
import numpy as np
import tensorflow as tf

import trainer
from tests.guarantees.workload import SGD, Workload, classified, synthetic_eval
from tests.plugins import task_plugins


class Counter(task_plugins.WithEma):
  """Its eval also reports its own state (per-step scalars): the counter and how far the
  averages are from the weights, so a resume that lost either reports other values."""

  def eval_step(self, batch):
    features, labels = batch
    logits = self.model(features)
    gap = tf.add_n([tf.reduce_sum(tf.abs(average - weight)) for average, weight
                    in zip(self.ema, self.model.trainable_variables)])
    return {"loss": keras.losses.sparse_categorical_crossentropy(labels, logits,
                                                                 from_logits=True),
            "accuracy": tf.cast(tf.argmax(logits, -1) == labels, tf.float32),
            "updates": tf.cast(self.updates, tf.float32), "ema_gap": gap}

  def export(self):
    return trainer.Export(model=self.model, output_name="logits")


def served(serve, replicas):
  """Its export of logits, scored as probabilities."""
  images, labels = synthetic_eval()
  logits = serve(images=tf.constant(images))["logits"].numpy().astype(np.float64)
  probabilities = np.exp(logits - logits.max(-1, keepdims=True))
  return classified(probabilities / probabilities.sum(-1, keepdims=True), labels)


WORKLOAD = Workload("task_counter",
                    ("--config=synthetic",
                     "--config.train.task=tests.guarantees.workloads.task_counter:Counter", *SGD),
                    served=served)
