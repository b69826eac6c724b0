"""Splits -> the tf.data streams the trainer consumes.

Owns the data position. The training stream is the concatenation of epochs,
epoch e being the training set in the order `stateless_shuffle(seed, e)`; global
batch k is examples [k*B, (k+1)*B) of that stream. So the position (examples used,
checkpointed with the step) says where a resumed run continues, and the batch sequence is the same for any number of
replicas or workers (the strategy splits each global batch, it never reorders).
Examples are gathered per batch from uint8 arrays held in memory, a single
vectorized op per batch, so the pipeline is never the bottleneck.
"""
import numpy as np
import tensorflow as tf

from input_pipelines.splits import Splits

_FOREVER = np.iinfo(np.int64).max


def train_dataset(splits: Splits, *, seed: int, global_batch_size: int,
                  start_example: int, salted: bool = False) -> tf.data.Dataset:
  """Infinite stream of global batches, starting at example `start_example` of the stream.

  `salted`: for asynchronous (parameter-server) workers, which cannot share one
  stream; each adds the clock at which it builds the pipeline to the seed, so
  no two workers read the same order.
  """
  num_examples = len(splits.train_labels)
  first_epoch, offset = divmod(start_example, num_examples)
  order_seed = tf.constant(seed, tf.int64)
  if salted:
    order_seed += tf.cast(tf.timestamp() * 1e6, tf.int64)

  def epoch_order(epoch):
    order = tf.random.experimental.stateless_shuffle(
        tf.range(num_examples, dtype=tf.int64), seed=tf.stack([order_seed, epoch]))
    return tf.data.Dataset.from_tensor_slices(order)

  indices = (tf.data.Dataset.range(first_epoch, _FOREVER)
             .flat_map(epoch_order)
             .skip(offset)
             .batch(global_batch_size, drop_remainder=True))
  return _gather(indices, splits.train_images, splits.train_labels)


def eval_dataset(splits: Splits, *, global_batch_size: int) -> tf.data.Dataset:
  """Every test example exactly once, in file order; the last batch may be partial."""
  indices = tf.data.Dataset.range(len(splits.test_labels)).batch(global_batch_size)
  return _gather(indices, splits.test_images, splits.test_labels)


def _gather(indices: tf.data.Dataset, images: np.ndarray, labels: np.ndarray) -> tf.data.Dataset:
  images = tf.constant(images)
  labels = tf.constant(labels)

  def lookup(batch_indices):
    batch_images = tf.cast(tf.gather(images, batch_indices), tf.float32) / 255.0
    return batch_images[..., tf.newaxis], tf.gather(labels, batch_indices)

  options = tf.data.Options()
  options.deterministic = True
  # The source is a range, not files: shard by data, never try to shard by file.
  options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
  return (indices.map(lookup, num_parallel_calls=tf.data.AUTOTUNE)
          .prefetch(tf.data.AUTOTUNE)
          .with_options(options))
