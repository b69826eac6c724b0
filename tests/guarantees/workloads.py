"""Tasks of the guarantee catalogue that no other test file has: extra state.

`Counter` is tests/task_plugins.py's WithEma (a step counter and moving averages,
tf.Variables the step assigns) with an eval step and an export, so that every check of
the matrix applies to it. `LayerAndGenerator` adds state a user holds in other forms:
a trained Keras layer as an attribute and a tf.random.Generator (issue 31, defect 1).
"""

import keras
import tensorflow as tf

import trainer
from tests import task_plugins


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


class LayerAndGenerator(Counter):
  """Its step also goes through a Dense layer held as an attribute (trained), and draws
  input noise from a tf.random.Generator: both are state a resume needs."""

  def build(self, context):
    self.model = task_plugins._model()  # pylint: disable=protected-access
    self.scale = keras.layers.Dense(10, name="scale")
    self.scale.build((None, 10))
    self.noise = tf.random.Generator.from_seed(context.config.runtime.seed)
    self.optimizer = context.optimizer(self.model.trainable_variables
                                       + self.scale.trainable_variables)
    self.ema = [tf.Variable(v, trainable=False, name=f"ema_{i}",
                            aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
                for i, v in enumerate(self.model.trainable_variables)]
    self.updates = tf.Variable(0, dtype=tf.int64, trainable=False,
                               aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)

  def train_step(self, batch, step):
    features, labels = batch
    variables = self.model.trainable_variables + self.scale.trainable_variables
    with tf.GradientTape() as tape:
      features += 0.05 * self.noise.normal(tf.shape(features))
      logits = self.scale(self.model(features))
      per_example = keras.losses.sparse_categorical_crossentropy(labels, logits,
                                                                 from_logits=True)
      loss = step.replica_loss(per_example)
    step.minimize(self.optimizer, tape, loss, variables)
    self.updates.assign_add(1)
    return {"loss": per_example}

  def export(self):
    return None  # the served model would leave out `scale`

  def eval_step(self, batch):
    features, labels = batch
    logits = self.scale(self.model(features))
    return {"loss": keras.losses.sparse_categorical_crossentropy(labels, logits,
                                                                 from_logits=True),
            "accuracy": tf.cast(tf.argmax(logits, -1) == labels, tf.float32)}


def embedding_gru(model_config, input_spec):
  """Embedding(mask_zero) -> GRU -> logits, its Input shaped by `input_spec` as a user
  writes it: the builder is told what length the data has (None: any)."""
  del model_config
  tokens = keras.Input(shape=input_spec.shape[1:], dtype=input_spec.dtype)
  embedded = keras.layers.Embedding(50, 8, mask_zero=True)(tokens)
  return keras.Model(tokens, keras.layers.Dense(2)(keras.layers.GRU(8)(embedded)))
