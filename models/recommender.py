"""A recommender: user and item embeddings, their dot product -> a click logit.

Features are int pairs [user_id, item_id]; the two outputs are the logits of "no
click" (0) and "click" (the dot product), for sparse_categorical_crossentropy. The
user table is model.num_users x model.embedding_dim floats (the default 50,000 x 512
is ~100 MB): under parameter_server with runtime.variable_partitioner it is split over
the servers (README: "Model parallelism on TensorFlow 2.21 + Keras 3").
"""
import keras
import ml_collections
import tensorflow as tf

import models


class ShardedEmbedding(keras.layers.Embedding):
  """keras.layers.Embedding that looks up the rows it needs where the table lives.

  Keras's own lookup (ops.take) first turns the table into one tensor: a table split
  over parameter servers would be read whole, every step, by every worker.
  tf.nn.embedding_lookup on the sharded table gathers on each server its rows only
  (its gradient: those rows, per shard). An unsharded table looks up as Keras does.
  """

  def call(self, inputs):
    table = self.embeddings.value  # the tf.Variable or ShardedVariable Keras holds
    if hasattr(table, "variables") and not isinstance(table, tf.Variable):  # sharded
      return tf.nn.embedding_lookup(table, tf.cast(inputs, tf.int64))
    return super().call(inputs)


class _Column(keras.layers.Layer):
  """Column `index` of the id pairs."""

  def __init__(self, index: int, **kwargs):
    super().__init__(**kwargs)
    self.index = index

  def call(self, ids):
    return ids[:, self.index]

  def get_config(self):
    return {**super().get_config(), "index": self.index}


class _ClickLogits(keras.layers.Layer):
  """[0, <user, item>]: the softmax of these is sigmoid(<user, item>)."""

  def call(self, user, item):
    score = keras.ops.sum(user * item, axis=-1, keepdims=True)
    return keras.ops.concatenate([keras.ops.zeros_like(score), score], axis=-1)


def _small():
  """Rows start near 0 (stddev 0.01): SGD from a small start grows the few directions
  the clicks need (the data's tastes have 8), where a wide start (0.3 at 512 wide) adds
  dot products of noise that 20 examples per user cannot unlearn. Measured in one
  process on the recommender data, 20 examples per user, 4 epochs of SGD: eval accuracy
  0.75 at 5,000 x 512 (0.57 from stddev 0.3), 0.82 at 1,000 x 16 (0.79 from 0.3); 3
  epochs at the default 50,000 x 512: 0.79 at rate 640 (0.80-0.82 on 2 ps + 2 workers at
  the default rate 320)."""
  return keras.initializers.RandomNormal(stddev=0.01)


def build(model_config: ml_collections.ConfigDict, input_spec) -> keras.Model:
  shape, dtype = models.single_input("recommender", input_spec)
  if shape != (2,) or not dtype.is_integer:
    raise models.ModelError(f"model.name='recommender' takes int pairs [user_id, item_id], "
                            f"not {dtype.name} features of shape {shape}")
  ids = keras.Input(shape=(2,), dtype=dtype.name, name="ids")
  user_ids, item_ids = _Column(0, name="user_id")(ids), _Column(1, name="item_id")(ids)
  user = ShardedEmbedding(model_config.num_users, model_config.embedding_dim,
                          embeddings_initializer=_small(), name="user_embedding")(user_ids)
  item = ShardedEmbedding(model_config.num_items, model_config.embedding_dim,
                          embeddings_initializer=_small(), name="item_embedding")(item_ids)
  return keras.Model(ids, _ClickLogits(name="logits")(user, item), name="recommender")
