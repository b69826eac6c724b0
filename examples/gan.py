"""A GAN in one file: a generator and a discriminator, two optimizers, one Task.

The data: points of a 2-D mixture of two Gaussians (modes at x = -2 and x = +2);
the generator learns to turn 8-D noise into such points. This file is also the
config: run it from anywhere, no install, nothing of distloop edited:

  python -m trainer --config=examples/gan.py --model_dir=/tmp/distloop/gan

What distloop keeps for this step as for its own: each optimizer's gradients are
all-reduced once (step.minimize), the noise is a stateless function of
(runtime.seed, step) (step.normal), so a resumed run draws the same noise and the
same global batch sees the same noise on 1, 2 or 3 replicas; both models and both
optimizers are checkpointed; --mode=export serves the generator (input `noise`,
output `samples`).
"""
import os

import keras
import numpy as np
import tensorflow as tf

import trainer
from configs import common

NOISE_DIM = 8
MODES = (-2.0, 2.0)  # the x of each mode; y = 0
MODE_STDDEV = 0.25


def mixture(data_config, seed):
  """(train, eval): points of the mixture, labels = which mode drew them."""
  def split(size, salt):
    rng = np.random.default_rng([seed, salt])
    labels = rng.integers(0, len(MODES), size)
    centers = np.stack([np.asarray(MODES)[labels], np.zeros(size)], axis=1)
    points = centers + MODE_STDDEV * rng.standard_normal((size, 2))
    return points.astype(np.float32), labels.astype(np.int64)
  return (split(data_config.num_train_examples, 0), split(data_config.num_eval_examples, 1))


def _mlp(name: str, outputs: int, inputs: int) -> keras.Model:
  return keras.Sequential([keras.Input((inputs,)),
                           keras.layers.Dense(64, activation="relu", name="hidden_1"),
                           keras.layers.Dense(64, activation="relu", name="hidden_2"),
                           keras.layers.Dense(outputs, name="out")], name=name)


def _cross_entropy(labels, logits):
  """Per example: sigmoid cross-entropy of one logit (float32 under mixed precision too)."""
  logits = tf.cast(logits, tf.float32)
  return tf.nn.sigmoid_cross_entropy_with_logits(labels=tf.fill(tf.shape(logits), labels),
                                                 logits=logits)[:, 0]


class Gan(trainer.Task):
  """Each step: one discriminator update, then one generator update (non-saturating)."""

  def build(self, context):
    self.generator = _mlp("generator", 2, NOISE_DIM)
    self.discriminator = _mlp("discriminator", 1, 2)
    # Two optimizers of train.optimizer / learning_rate (the config's), one per model.
    self.generator_optimizer = context.optimizer(self.generator.trainable_variables)
    self.discriminator_optimizer = context.optimizer(self.discriminator.trainable_variables)

  def train_step(self, batch, step):
    real, _ = batch
    with tf.GradientTape() as tape:
      fake = self.generator(step.normal([NOISE_DIM]), training=True)
      d_loss = (_cross_entropy(1.0, self.discriminator(real, training=True))
                + _cross_entropy(0.0, self.discriminator(fake, training=True)))
      loss = step.replica_loss(d_loss)
    step.minimize(self.discriminator_optimizer, tape, loss,
                  self.discriminator.trainable_variables, name="discriminator")
    with tf.GradientTape() as tape:
      fake = self.generator(step.normal([NOISE_DIM], salt=1), training=True)
      g_loss = _cross_entropy(1.0, self.discriminator(fake, training=True))
      loss = step.replica_loss(g_loss)
    step.minimize(self.generator_optimizer, tape, loss, self.generator.trainable_variables,
                  name="generator")
    return {"discriminator_loss": d_loss, "generator_loss": g_loss}

  def eval_step(self, batch):
    real, _ = batch
    fake = self.generator(tf.random.stateless_normal([tf.shape(real)[0], NOISE_DIM], [1, 2]))
    return {"real_scored_real": tf.cast(self.discriminator(real)[:, 0] > 0, tf.float32),
            "fake_scored_real": tf.cast(self.discriminator(fake)[:, 0] > 0, tf.float32),
            "fake_left_of_zero": tf.cast(fake[:, 0] < 0, tf.float32)}

  def predict_step(self, batch, step):
    """--mode=predict: a generator sample per row of the split, its noise a function of
    the row (step.normal), so a rerun after a kill, or on any shape, writes the same."""
    del batch
    return {"samples": self.generator(step.normal([NOISE_DIM]))}

  def export(self):
    return trainer.Export(model=self.generator, output_name="samples",
                          input_spec=tf.TensorSpec([None, NOISE_DIM], tf.float32, name="noise"))


def get_config():
  here = os.path.abspath(__file__)
  config = common.base_config()
  config.train.task = f"{here}:Gan"
  config.data.name = f"{here}:mixture"
  config.data.num_train_examples = 8192
  config.data.num_eval_examples = 1024
  config.train.steps = 3000
  config.train.global_batch_size = 96  # divisible by 1, 2 and 3 replicas
  config.train.optimizer = "adam"
  # The GAN recipe's Adam (DCGAN): with Keras's beta_1=0.9 the generator fell to one mode
  # in some runs, 0.5 covered both with every seed tried.
  config.train.optimizer_args = "beta_1=0.5"
  config.train.learning_rate = 1e-3
  config.train.steps_per_loop = 100
  config.checkpoint.interval = 1000
  config.lock()
  return config
