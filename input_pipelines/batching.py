"""Sources -> the tf.data streams the trainer consumes. Owns the data position.

The training stream is the concatenation of epochs, epoch e being the training
set in the order `stateless_shuffle(seed, e)`; global batch k is examples
[k*B, (k+1)*B) of that stream. So the position (examples used, checkpointed with
the step) says where a resumed run continues, and the batch sequence is the same
for any number of replicas or workers (the strategy splits each global batch,
it never reorders). The same order holds for every indexable source.

Per batch: the source is read at the batch's indices (a vectorized gather from
memory, or the user's `__getitem__` through `tf.numpy_function`, in parallel);
then, if `data.preprocess` is set, every training example goes through it with
the stateless seed (runtime.seed, its position in the stream), so augmentation
is random yet the same after a resume.

An opaque `StreamSource` (a callable returning a tf.data.Dataset) cannot be
indexed: its training stream is `dataset.repeat()`, and a run resumed at example
p skips the first p examples, so resume is exact when the callable's dataset is
deterministic (the same elements in the same order every time it is built); the
skip reads and drops those p examples, which costs time proportional to p.
"""
from typing import Callable

import numpy as np
import tensorflow as tf

from input_pipelines.sources import ArraySource, IndexedSource, Source, StreamSource

_FOREVER = np.iinfo(np.int64).max


def train_dataset(source: Source, *, seed: int, global_batch_size: int, start_example: int,
                  preprocess: Callable | None = None, salted: bool = False,
                  decode_on_device: bool = False) -> tf.data.Dataset:
  """Infinite stream of global batches `(features, labels)`, from example `start_example`.

  `salted`: for asynchronous (parameter-server) workers, which cannot share one
  stream; each adds the clock at which it builds the pipeline to the seed, so
  no two workers read the same order. `decode_on_device`: leave the source's
  decode (`device_decoder`) to the train step.
  """
  if isinstance(source, StreamSource):
    examples = (source.make_dataset().repeat().skip(start_example)
                .enumerate(start_example).map(lambda position, example: (position, *example)))
    positioned = examples.batch(global_batch_size, drop_remainder=True)
  else:
    num_examples = len(source)
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
               .enumerate(start_example)
               .batch(global_batch_size, drop_remainder=True))
    read = _reader(source, decode=not decode_on_device)
    positioned = indices.map(lambda positions, rows: (positions, *read(rows)),
                             num_parallel_calls=tf.data.AUTOTUNE)
  if preprocess is not None:
    positioned = _preprocessed(positioned, preprocess, seed, global_batch_size)
  return _finish(positioned.map(lambda positions, features, labels: (features, labels)))


def eval_dataset(source: Source, *, global_batch_size: int,
                 decode_on_device: bool = False) -> tf.data.Dataset:
  """Every eval example exactly once, in source order; the last batch may be partial."""
  if isinstance(source, StreamSource):
    return _finish(source.make_dataset().batch(global_batch_size))
  indices = tf.data.Dataset.range(len(source)).batch(global_batch_size)
  return _finish(indices.map(_reader(source, decode=not decode_on_device),
                             num_parallel_calls=tf.data.AUTOTUNE))


def device_decoder(source: Source) -> Callable | None:
  """The source's batch decode (e.g. uint8 images -> float32 in [0, 1]), for the step to
  run on the device: the host then feeds 4x fewer bytes. None if it has none."""
  return getattr(source, "decode", None)


def _reader(source: Source, decode: bool = True) -> Callable:
  """`rows (int64 [b]) -> (features, labels)` batch, in TensorFlow."""
  if isinstance(source, ArraySource):
    # Held in the graph and gathered per batch: one vectorized op.
    features = tf.nest.map_structure(tf.constant, source.features)
    labels = tf.constant(source.labels)

    def gather(rows):
      batch = tf.nest.map_structure(lambda a: tf.gather(a, rows), features)
      if decode and source.decode is not None:
        batch = source.decode(batch)
      return batch, tf.gather(labels, rows)
    return gather
  if isinstance(source, IndexedSource):
    return _indexed_reader(source)
  raise TypeError(f"cannot index {type(source).__name__}")


def _indexed_reader(source: IndexedSource) -> Callable:
  """The user's `__getitem__` on a batch of rows, through tf.numpy_function."""
  keys = source.structure  # None: bare-array features
  leaf_keys = keys if keys is not None else [""]
  specs = [source.example_spec[k] for k in leaf_keys] + [source.example_spec["labels"]]

  def read_numpy(rows):
    features, labels = source.read(rows)
    leaves = [features[k] for k in keys] if keys is not None else [features]
    return [*leaves, labels]

  def read(rows):
    tensors = tf.numpy_function(read_numpy, [rows], [tf.as_dtype(dtype) for _, dtype in specs],
                                stateful=False)
    for tensor, (shape, _) in zip(tensors, specs):
      tensor.set_shape([None, *shape])
    *leaves, labels = tensors
    features = dict(zip(keys, leaves)) if keys is not None else leaves[0]
    return features, labels
  return read


def _preprocessed(positioned: tf.data.Dataset, preprocess: Callable, seed: int,
                  global_batch_size: int) -> tf.data.Dataset:
  """Per example: `preprocess(features, labels, seed=[runtime.seed, position])`, rebatched."""
  def one(position, features, labels):
    features, labels = preprocess(features, labels, tf.stack([tf.constant(seed, tf.int64),
                                                              position]))
    return position, features, labels
  return (positioned.unbatch()
          .map(one, num_parallel_calls=tf.data.AUTOTUNE)
          .batch(global_batch_size, drop_remainder=True))


def _finish(dataset: tf.data.Dataset) -> tf.data.Dataset:
  options = tf.data.Options()
  options.deterministic = True
  # The source is a range, not files: shard by data, never try to shard by file.
  options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
  return dataset.prefetch(tf.data.AUTOTUNE).with_options(options)
