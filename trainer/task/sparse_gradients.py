"""Sparse gradients (tf.IndexedSlices: the rows an Embedding looked up), summed per row.

The global norm of an IndexedSlices is the norm of its `values`, which is the gradient's
norm only when no row repeats: a token seen twice in a batch counted twice in gradient_norm
and train.clip_grad_norm (1 and 2 replicas differed by 4e-3 with clipping). Summing the
repeated rows first makes it the gradient's norm, on any replica count.

Across replicas (trainer/task/contexts.py `_all_sum`) a sparse gradient of static row
count goes through TensorFlow's IndexedSlices all-reduce; one whose count varies with
each replica's padded length is made dense first: kept sparse, TensorFlow's all-reduce
and an all-gather of each replica's rows padded to the longest both aborted inside the
compiled loop with a collective shape mismatch at some steps (TF 2.21, CPU: an Embedding
into a GRU, its data grouped by length, steps 16..20 of 5-step loops). The rows are
summed after the reduction, where they repeat across replicas too.
"""
import tensorflow as tf


def deduplicated(slices: tf.IndexedSlices) -> tf.IndexedSlices:
  """The same gradient with each row index once (its rows summed)."""
  unique, positions = tf.unique(slices.indices)
  values = tf.math.unsorted_segment_sum(slices.values, positions, tf.shape(unique)[0])
  return tf.IndexedSlices(values, unique, slices.dense_shape)
