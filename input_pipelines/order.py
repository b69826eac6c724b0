"""The order of the training stream, in constant memory: position -> row of the source.

Position p counts training examples from the start of training (epochs laid end
to end). It lies in epoch e = p // N at slot p % N, and reads row

    tf.random.experimental.index_shuffle(p % N, [seed, e], N - 1)

of the source: a stateless permutation of 0..N-1 per (seed, epoch), computed
per position, so nothing N-sized is ever built (N may be 10^9). Every source
uses this one function -- arrays in memory, a user's random-access source,
converted records on disk -- so converting a dataset does not change the
training trajectory, and neither does the number of replicas or workers (they
split positions, never reorder them).

Why the raw op: `index_shuffle` takes per-position seeds ([n, 2]) on paper,
but in TF 2.21 it pads them along the wrong axis; the raw op with the same
padding constant computes exactly what the public function computes for a [2]
seed, for a whole vector of positions with their own epochs at once.
"""
import tensorflow as tf

_SEED_PAD = 498247692  # what index_shuffle puts in front of a [2] seed
_ROUNDS = 4  # index_shuffle's


def rows(positions: tf.Tensor, seed: tf.Tensor, num_examples: int) -> tf.Tensor:
  """int64 positions [b] -> int64 rows [b] of a source of `num_examples` rows."""
  positions = tf.convert_to_tensor(positions, tf.int64)
  seed = tf.cast(seed, tf.int64)
  n = tf.constant(num_examples, tf.int64)
  epochs = positions // n
  seeds = tf.stack([tf.fill(tf.shape(positions), tf.constant(_SEED_PAD, tf.int64)),
                    tf.fill(tf.shape(positions), seed), epochs], axis=1)
  return tf.raw_ops.RandomIndexShuffle(index=positions % n, seed=seeds, max_index=n - 1,
                                       rounds=_ROUNDS)
