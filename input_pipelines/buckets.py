"""Length bucketing (`data.bucket_window`): which positions form each global batch when
examples vary in length, so a batch of short examples is padded to a short boundary.

Without it a batch holds B random examples and is padded to about the longest
length in the data (lengths 5..200 at B=64: every batch 133..200 long). With it,
the positions are taken a window of W global batches at a time, window w =
positions [w*W*B, (w+1)*W*B) (absolute: the same windows whatever the run's start):

  1. read the lengths of the window's rows (order.rows: the usual order),
  2. sort the window's positions by length (stable: ties keep their order),
  3. cut them into W batches of B and permute those batches by a stateless
     permutation of (seed, w) (order.rows with a salted seed), so batch lengths
     come in random order rather than short to long.

The result is a bijection of each window's positions: every example is used
exactly once per epoch as before, and the global batch sequence is a pure
function of (seed, position, B, W), the same on every worker and for any
replica count (each input pipeline computes the whole window and keeps its
replicas' share). A run resumed at any example continues mid-window exactly;
changing B on resume would regroup windows (trainer/state/config_changes.py
refuses it). With it each global batch also carries its longest length per
variable leaf, and every replica pads its share to that (one shape per step).
Cost: each pipeline reads the lengths of all W*B examples of a window once
(a read of those examples for sources that cannot say a length without it).
"""
from typing import Callable

import numpy as np
import tensorflow as tf

from input_pipelines import order

_FOREVER = np.iinfo(np.int64).max
_SALT = 0x6275636B  # "buck": the batches' permutation is not the rows' one (same seed)


def global_batches(*, start_example: int, global_batch_size: int, window: int,
                   seed: tf.Tensor, num_examples: int,
                   lengths: Callable[[tf.Tensor], tf.Tensor]) -> tf.data.Dataset:
  """`(positions int64 [B], longest int64 [V])` per global batch from `start_example`.
  `lengths`: rows int64 [n] -> int64 [n, V], each row's length in each variable leaf."""
  size = window * global_batch_size
  first_window = start_example // size
  salted = tf.bitwise.bitwise_xor(tf.cast(seed, tf.int64), tf.constant(_SALT, tf.int64))

  def arrange(w):
    positions = w * size + tf.range(size, dtype=tf.int64)
    length = lengths(order.rows(positions, seed, num_examples))
    by_length = tf.argsort(tf.reduce_max(length, axis=1), stable=True)
    batches = tf.reshape(tf.gather(positions, by_length), [window, global_batch_size])
    batch_lengths = tf.reshape(tf.gather(length, by_length),
                               [window, global_batch_size, tf.shape(length)[1]])
    shuffle = order.rows(w * window + tf.range(window, dtype=tf.int64), salted, window)
    return (tf.reshape(tf.gather(batches, shuffle), [-1]),
            tf.reshape(tf.gather(batch_lengths, shuffle), [size, -1]))

  return (tf.data.Dataset.range(first_window, _FOREVER)
          .map(arrange, num_parallel_calls=tf.data.AUTOTUNE)
          .unbatch()
          .skip(start_example - first_window * size)
          .batch(global_batch_size, drop_remainder=True)
          .map(lambda positions, length: (positions, tf.reduce_max(length, axis=0))))
