"""Sources -> the tf.data streams the trainer consumes. Owns which rows form each batch.

Training: global batch k is positions [s + k*B, s + (k+1)*B) of the stream (s:
the checkpointed `start_example`), and position p reads the row that
input_pipelines/order.py gives it (a stateless permutation per (seed, epoch)).
So the position says where a resumed run continues, and the batches are the
same for any number of replicas or workers.

Who reads what: under `strategy.distribute_datasets_from_function`, each input
pipeline (one per worker) builds only the per-replica batches of its own
replicas. Replica r of R (global id; the strategy numbers them worker by
worker, and hands the elements of a pipeline's dataset to its L local replicas
in turn) gets positions s + k*B + [r*b, (r+1)*b), b = B/R: a worker reads only
its share of every global batch, and the replicas' shares add up to the global
batch whatever R is. Without an input context (the parameter-server workers,
start-up probes) each element is a whole global batch.

Per element: rows from the order, then the source's `read_leaves` in
tf.numpy_function (numpy gather from memory, a user's `__getitem__`, or records
from disk), many elements in parallel (AUTOTUNE, order kept); then the
source's `assemble` in TensorFlow (decoding); then, if `data.preprocess` is
set, every example goes through it with the stateless seed (runtime.seed, its
position), so augmentation is random yet the same after a resume; prefetch.

Eval: every example once, in source order. Eval batch k is examples
[k*E, min((k+1)*E, N)); replica r gets its slice of ceil(E/R) of them, which
may be empty on the last batch (the eval step skips the model for it: it adds
nothing to the sums; trainer/loop/steps.py make_eval_pass). Training slices never are:
the global batch divides by the replica count (runtime.check_batch_divisible).

Variable-length examples (`data.pad_to`, input_pipelines/padding.py): each
per-replica batch is padded to its own longest example, or up to a bucket
boundary, with `data.pad_value`: in the numpy read for indexable sources (one
per-replica batch per read, so the padding is the batch's own), with
`padded_batch` for streams (an eval stream's batch is padded as a global batch,
then sliced). The padding depends only on the batch's rows: the order and an
exact resume hold as for fixed shapes. With `data.bucket_window` (indexable
sources; input_pipelines/buckets.py) the positions of each window of global
batches are regrouped by length first, and every replica's share is padded to
its global batch's length: still a pure function of (seed, position). `data.preprocess` receives each example
as padded in its batch, and its results are padded again per batch.

An opaque `StreamSource` (a callable returning a tf.data.Dataset) cannot be
indexed; each time it is built its element spec is checked (fixed-shape
examples unless data.pad_to is set, one label tensor: `StreamSource.check_element_spec`, a DataError
naming the split otherwise). Its training stream is `dataset.repeat()`; a run resumed at example p
skips the first p examples (`skip` reads and drops them: time proportional to
p), so resume is exact when the callable builds the same elements in the same
order every time. Every worker builds the whole stream and keeps its replicas'
share of each global batch (it reads everything, uses 1/workers of it).
"""
import dataclasses
from typing import Callable

import numpy as np
import tensorflow as tf

from input_pipelines import autograph_scope
from input_pipelines import buckets
from input_pipelines import order
from input_pipelines import padding as padding_lib
from input_pipelines import read_log
from input_pipelines.errors import DataError
from input_pipelines.sources import ArraySource, IndexableSource, Source, StreamSource

_FOREVER = np.iinfo(np.int64).max
# Small batches are read a few at a time: one numpy call per element would cost more
# than the gather itself (measured: batch 32 read alone ran at half the speed). Big
# examples are read a per-replica batch at a time: with ~4 MiB per read, the reads in
# flight (AUTOTUNE) hold about the same memory whatever the examples' size.
_ROWS_PER_READ = 256
_BYTES_PER_READ = 4 << 20


@dataclasses.dataclass(frozen=True)
class _Share:
  """This input pipeline's replicas: ids first..first+local-1 of `replicas`."""
  replicas: int = 1
  first: int = 0
  local: int = 1

  @classmethod
  def of(cls, input_context: tf.distribute.InputContext | None) -> "_Share":
    if input_context is None:
      return cls()
    replicas, pipelines = (input_context.num_replicas_in_sync,
                           input_context.num_input_pipelines)
    if replicas % pipelines:
      raise ValueError(f"{replicas} replicas do not split evenly over {pipelines} "
                       f"input pipelines")
    local = replicas // pipelines
    return cls(replicas, input_context.input_pipeline_id * local, local)


def train_dataset(source: Source, *, seed: int, global_batch_size: int, start_example: int,
                  preprocess: Callable | None = None, salted: bool = False,
                  input_context: tf.distribute.InputContext | None = None,
                  stream: str = "train", decode_on_device: bool = False) -> tf.data.Dataset:
  """Infinite stream of batches `(features, labels)` from example `start_example`: global
  batches, or with `input_context` the per-replica batches of that pipeline's replicas.

  `salted`: for asynchronous (parameter-server) workers, which cannot share one
  stream; each adds the clock at which it builds the pipeline to the seed, so
  no two workers read the same order. `decode_on_device`: leave the source's
  decode (`device_decoder`) to the train step.
  """
  share = _Share.of(input_context)
  if global_batch_size % share.replicas:
    raise ValueError(f"global batch {global_batch_size} does not split over "
                     f"{share.replicas} replicas")
  per_replica = global_batch_size // share.replicas
  if isinstance(source, StreamSource):
    positioned = _stream_train(source, start_example, per_replica, share)
  else:
    order_seed = tf.constant(seed, tf.int64)
    if salted:
      order_seed += tf.cast(tf.timestamp() * 1e6, tf.int64)
    read = _reader(source, stream, decode=not decode_on_device)
    if grouped_by_length(source):
      positioned = _bucketed_train(source, read, start_example, global_batch_size,
                                   per_replica, share, order_seed)
    elif preprocess is None:  # the positions are not needed: never carried per element
      return _finish(_positioned(source, read, start_example, global_batch_size, per_replica,
                                 share, order_seed, with_positions=False))
    else:
      positioned = _positioned(source, read, start_example, global_batch_size, per_replica,
                               share, order_seed)
  if preprocess is not None:
    positioned = _preprocessed(positioned, preprocess, seed, per_replica, source.padding)
  return _finish(positioned.map(lambda positions, features, labels: (features, labels)))


def _positioned(source: IndexableSource, read: Callable, start_example: int,
                global_batch_size: int, per_replica: int, share: _Share,
                order_seed: tf.Tensor, with_positions: bool = True) -> tf.data.Dataset:
  """(positions, features, labels) per-replica batches of this pipeline's replicas, global
  batch k = positions start_example + [k*B, (k+1)*B); (features, labels) without
  `with_positions` (one map less per batch: at batch 1 a tenth of the pipeline's time)."""
  num_examples = len(source)
  rows = min(_ROWS_PER_READ, _BYTES_PER_READ // max(1, source.example_bytes()))
  chunk = max(1, rows // per_replica)  # elements read by one call
  if _variable(source):  # one per-replica batch per read: padded to its own longest
    chunk = 1

  def elements(c):  # element j: replica first + j % local of step j // local
    j = c * chunk + tf.range(chunk, dtype=tf.int64)
    step, replica = j // share.local, share.first + j % share.local
    first = start_example + step * global_batch_size + replica * per_replica
    positions = first[:, None] + tf.range(per_replica, dtype=tf.int64)[None, :]
    features, labels = read(order.rows(tf.reshape(positions, [-1]), order_seed,
                                       num_examples))
    # Every element holds exactly per_replica examples: said statically, also for a read
    # of one batch (whose rows tf.numpy_function cannot tell), so the step is traced for
    # that batch size (XLA, the per-example values' lengths known when traced).
    split = lambda t: (tf.ensure_shape(t[None], [1, per_replica, *t.shape[1:]])  # pylint: disable=unnecessary-lambda-assignment
                       if chunk == 1 else tf.reshape(t, [chunk, per_replica, *t.shape[1:]]))
    features, labels = tf.nest.map_structure(split, (features, labels))
    return (positions, features, labels) if with_positions else (features, labels)

  return (tf.data.Dataset.range(_FOREVER)
          .map(elements, num_parallel_calls=tf.data.AUTOTUNE).unbatch())


def _bucketed_train(source: IndexableSource, read: Callable, start_example: int,
                    global_batch_size: int, per_replica: int, share: _Share,
                    order_seed: tf.Tensor) -> tf.data.Dataset:
  """(positions, features, labels) per-replica batches of this pipeline's replicas, the
  global batches grouped by length (input_pipelines/buckets.py), each replica's share
  padded to the global batch's longest."""
  num_examples = len(source)
  batches = buckets.global_batches(
      start_example=start_example, global_batch_size=global_batch_size,
      window=source.padding.window, seed=order_seed, num_examples=num_examples,
      lengths=_length_reader(source))

  def shares(positions, longest):  # this pipeline's replicas' slices of the global batch
    mine = positions[share.first * per_replica:(share.first + share.local) * per_replica]
    return (tf.reshape(mine, [share.local, per_replica]),
            tf.repeat(longest[None], share.local, axis=0))

  def element(positions, longest):
    features, labels = read(order.rows(positions, order_seed, num_examples), longest)
    # per_replica rows, said statically (tf.numpy_function cannot tell), as _positioned
    # does: under whole-step XLA a per-example value of unknown length failed the step.
    features, labels = tf.nest.map_structure(
        lambda t: tf.ensure_shape(t, [per_replica, *t.shape[1:]]), (features, labels))
    return positions, features, labels

  return (batches.map(shares).unbatch()
          .map(element, num_parallel_calls=tf.data.AUTOTUNE))


def eval_dataset(source: Source, *, global_batch_size: int,
                 input_context: tf.distribute.InputContext | None = None,
                 decode_on_device: bool = False) -> tf.data.Dataset:
  """Every eval example exactly once, in source order; the last batch may be partial, and
  with `input_context` a replica's slice of it may be empty."""
  share = _Share.of(input_context)
  per_replica = -(-global_batch_size // share.replicas)
  if isinstance(source, StreamSource):
    return _finish(_stream_eval(source, global_batch_size, per_replica, share))
  num_examples = len(source)
  num_batches = -(-num_examples // global_batch_size)
  read = _reader(source, "eval", decode=not decode_on_device)

  def element(j):
    step, replica = j // share.local, share.first + j % share.local
    end = tf.minimum((step + 1) * global_batch_size, num_examples)
    first = tf.minimum(step * global_batch_size + replica * per_replica, end)
    return read(tf.range(first, tf.minimum(first + per_replica, end), dtype=tf.int64))

  elements = tf.data.Dataset.range(num_batches * share.local)
  return _finish(elements.map(element, num_parallel_calls=tf.data.AUTOTUNE))


def predict_dataset(source: Source, *, global_batch_size: int, start: int,
                    input_context: tf.distribute.InputContext | None = None,
                    decode_on_device: bool = False) -> tf.data.Dataset:
  """`(rows, keep, features, labels)` batches of the rows `start`.. of an indexable
  source, in source order (batch k: rows start + [k*B, (k+1)*B)), every replica's slice
  exactly ceil(B/R) rows: past the last row a slice repeats it with `keep` false, so no
  replica runs on an empty or shorter batch (a fixed shape; the model is called on
  every slice) and the host drops what `keep` says is not a row. `rows` are the
  examples' indices in the source."""
  share = _Share.of(input_context)
  per_replica = -(-global_batch_size // share.replicas)
  num_examples = len(source)
  num_batches = -(-(num_examples - start) // global_batch_size)
  read = _reader(source, "predict", decode=not decode_on_device)

  def element(j):
    step, replica = j // share.local, share.first + j % share.local
    first = start + step * global_batch_size + replica * per_replica
    end = tf.minimum(start + (step + 1) * global_batch_size, num_examples)
    wanted = first + tf.range(per_replica, dtype=tf.int64)
    keep = wanted < end
    rows = tf.minimum(wanted, num_examples - 1)
    features, labels = read(rows)
    return rows, keep, features, labels

  elements = tf.data.Dataset.range(max(num_batches, 0) * share.local)
  return _finish(elements.map(element, num_parallel_calls=tf.data.AUTOTUNE))


def example_spec(source: Source):
  """(features, labels) spec of one example as `data.preprocess` receives it (traced, no
  data read; variable-length dims None). A stream's dataset is built and its elements
  checked (fixed-shape examples unless data.pad_to is set, one label tensor): DataError
  naming the split otherwise."""
  if isinstance(source, StreamSource):
    return _stream_examples(source).element_spec
  read = _reader(source, "probe")
  batch_spec = tf.data.Dataset.from_tensors(tf.zeros([1], tf.int64)).map(read).element_spec
  return tf.nest.map_structure(lambda spec: tf.TensorSpec(spec.shape[1:], spec.dtype),
                               batch_spec)


def check_stream(source: StreamSource) -> None:
  """A stream split at start-up: its elements checked (`example_spec`) and its first one
  read. DataError if it yields none, as for an empty in-memory split: an empty eval
  split would report 0.0 for every value, an empty train split never makes a batch."""
  if next(iter(_stream_examples(source).take(1)), None) is None:
    raise DataError(f"{source.where}: the split is empty (the dataset yields no example)")


def batch_spec(source: Source, element_spec, batch):
  """TensorSpecs `[None, ...]` of the batches of `source`, as the model's input_spec and
  the export's signature take them: a dimension that varies in the data (`data.pad_to`:
  each batch padded to its own length, None in the pipeline's `element_spec`) is None,
  every other one as `batch` (a real batch) has it: a shape TensorFlow lost on the way
  (a preprocess) is not taken for a varying one."""
  def spec(element, tensor):
    dims = [None, *[None if source.padding is not None and varies is None else size
                    for varies, size in zip(element.shape[1:], tensor.shape[1:])]]
    return tf.TensorSpec(dims, tensor.dtype)
  return tf.nest.map_structure(spec, element_spec, batch)


def _stream_examples(source: StreamSource) -> tf.data.Dataset:
  """The user's dataset, its element spec checked; DataError if building it fails."""
  try:
    dataset = source.make_dataset()
  except (Exception, SystemExit) as e:  # pylint: disable=broad-except  (user code)
    text = str(e).strip()
    raise DataError(f"{source.where}: building the dataset raised {type(e).__name__}"
                    f"{': ' + text.splitlines()[0][:300] if text else ''}") from None
  if not isinstance(dataset, tf.data.Dataset):
    raise DataError(f"{source.where}: the callable must return a tf.data.Dataset, got "
                    f"{type(dataset).__name__}")
  source.check_element_spec(dataset.element_spec)
  return dataset


def _stream_train(source: StreamSource, start_example: int, per_replica: int,
                  share: _Share) -> tf.data.Dataset:
  """(positions, features, labels) per-replica batches of this pipeline's replicas."""
  examples = (_stream_examples(source).repeat().skip(start_example)
              .enumerate(start_example).map(lambda position, example: (position, *example)))
  batches = _batch(examples, per_replica, source.padding, drop_remainder=True)
  if share.local == share.replicas:
    return batches
  def mine(i, batch):  # per-replica batch i is replica i % R of step i // R
    del batch
    replica = i % share.replicas
    return (replica >= share.first) & (replica < share.first + share.local)
  return batches.enumerate().filter(mine).map(lambda i, batch: batch)


def _stream_eval(source: StreamSource, global_batch_size: int, per_replica: int,
                 share: _Share) -> tf.data.Dataset:
  def replicas_slices(*batch):
    def slice_of(replica):
      return tf.nest.map_structure(
          lambda t: t[replica * per_replica:(replica + 1) * per_replica], batch)
    return tf.data.Dataset.range(share.first, share.first + share.local).map(slice_of)
  return (_batch(_stream_examples(source), global_batch_size, source.padding)
          .flat_map(replicas_slices))


def _batch(examples: tf.data.Dataset, size: int, padding: padding_lib.Padding | None,
           drop_remainder: bool = False) -> tf.data.Dataset:
  """Batches of `size` examples; with `padding`, each padded to its longest (padded_batch)
  and then up to its bucket boundary."""
  if padding is None:
    return examples.batch(size, drop_remainder=drop_remainder)
  spec = examples.element_spec
  values = tf.nest.map_structure(lambda s: padding_lib.pad_constant(s.dtype, padding.value),
                                 spec)
  batches = examples.padded_batch(size, padding_values=values, drop_remainder=drop_remainder)
  if not padding.boundaries:
    return batches
  return batches.map(lambda *batch: padding_lib.to_buckets(batch, padding, spec))


def _variable(source: IndexableSource) -> bool:
  """Whether a leaf's length varies from example to example (padded per batch)."""
  return source.padding is not None and any(padding_lib.is_variable(shape)
                                            for shape, _ in source.leaf_specs())


def grouped_by_length(source: IndexableSource) -> bool:
  """Whether training batches are grouped by length (`data.bucket_window`): their rows
  are then not a range of positions (python -m trainer.inspect refuses them)."""
  return _variable(source) and source.padding.window > 0


def _length_reader(source: IndexableSource) -> Callable:
  """`rows (int64 [n]) -> int64 [n, V]`: each row's length in each variable leaf."""
  specs = source.leaf_specs()
  num_variable = sum(padding_lib.is_variable(shape) for shape, _ in specs)

  def lengths(rows):
    length = tf.numpy_function(lambda r: padding_lib.lengths(source.read_leaves(r), specs),
                               [rows], tf.int64, stateful=False)
    length.set_shape([None, num_variable])
    return length
  return lengths


def device_decoder(source: Source) -> Callable | None:
  """An in-memory source's batch decode (e.g. uint8 images -> float32 in [0, 1]), for the
  train step to run on the device: the host then feeds 4x fewer bytes. None if none."""
  return source.decode if isinstance(source, ArraySource) else None


def _reader(source: IndexableSource, stream: str, decode: bool = True) -> Callable:
  """`rows (int64 [b]) -> (features, labels)` batch, in TensorFlow: the source's numpy
  read in tf.numpy_function (data stays in numpy or on disk, never a graph constant),
  then its TensorFlow `assemble`."""
  if not isinstance(source, IndexableSource):
    raise TypeError(f"cannot index {type(source).__name__}")
  specs = source.leaf_specs()
  assemble = autograph_scope.user_function(source.assemble)  # a user's source: converted
  dtypes = [tf.string if np.dtype(dtype).kind in "SO" else tf.as_dtype(dtype)
            for _, dtype in specs]

  def read_numpy(rows, longest=None):
    if len(rows) == 0:  # an eval replica's empty slice: do not ask the source
      return [np.zeros((0, *[0 if d is None else d for d in shape]),
                       dtype=object if tf_dtype == tf.string else dtype)
              for (shape, dtype), tf_dtype in zip(specs, dtypes)]
    read_log.record(stream, rows)
    return padding_lib.pad_leaves(source.read_leaves(rows), specs, source.padding, longest)

  def read(rows, longest=None):
    """`longest` (int64 [V]): pad each variable leaf to at least this (a global batch's)."""
    inputs = [rows] if longest is None else [rows, longest]
    leaves = tf.numpy_function(read_numpy, inputs, dtypes, stateful=False)
    for leaf, (shape, _) in zip(leaves, specs):
      leaf.set_shape([None, *shape])
    if not decode and device_decoder(source) is not None:  # the step decodes, on the device
      return assemble(leaves, decode=False)
    return assemble(leaves)
  return read


def _preprocessed(positioned: tf.data.Dataset, preprocess: Callable, seed: int,
                  batch_size: int, padding: padding_lib.Padding | None = None
                  ) -> tf.data.Dataset:
  """Per example: `preprocess(features, labels, seed=[runtime.seed, position])`, rebatched
  (with `padding`: padded again, as the function may change lengths)."""
  def one(position, features, labels):
    features, labels = preprocess(features, labels, tf.stack([tf.constant(seed, tf.int64),
                                                              position]))
    return position, features, labels
  return _batch(positioned.unbatch().map(one, num_parallel_calls=tf.data.AUTOTUNE),
                batch_size, padding, drop_remainder=True)


def _finish(dataset: tf.data.Dataset) -> tf.data.Dataset:
  options = tf.data.Options()
  options.deterministic = True
  # Each pipeline reads its own share (input contexts); never shard again by file or data.
  options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
  return dataset.prefetch(tf.data.AUTOTUNE).with_options(options)
