"""The data position: the batch order is a pure function of (seed, epoch) and the step."""
import numpy as np
import pytest

from input_pipelines import batching
from input_pipelines.datasets.splits import Splits


def _splits(n_train=100, n_test=23):
  # Image k is filled with k % 256 and labelled k % 10, so a batch reveals its indices.
  def make(n):
    ids = np.arange(n)
    return np.broadcast_to((ids % 256).astype(np.uint8)[:, None, None], (n, 28, 28)).copy(), ids % 10
  train_images, train_labels = make(n_train)
  test_images, test_labels = make(n_test)
  return Splits(train_images, train_labels, test_images, test_labels).sources("test")


def _first_pixels(dataset, num_batches):
  return [np.round(images.numpy()[:, 0, 0, 0] * 255).astype(int).tolist()
          for images, _ in dataset.take(num_batches)]


def test_each_epoch_is_a_permutation_that_depends_on_seed_and_epoch():
  batches = _first_pixels(batching.train_dataset(_splits()[0], seed=1, global_batch_size=10,
                                                 start_example=0), 20)
  epoch0, epoch1 = sum(batches[:10], []), sum(batches[10:], [])
  assert sorted(epoch0) == sorted(epoch1) == list(range(100))
  assert epoch0 != epoch1 and epoch0 != list(range(100))
  other_seed = sum(_first_pixels(batching.train_dataset(
      _splits()[0], seed=2, global_batch_size=10, start_example=0), 10), [])
  assert other_seed != epoch0


@pytest.mark.parametrize("start_step", [1, 7, 13, 29])
def test_resuming_at_a_step_continues_the_same_stream(start_step):
  """Batch size 30 does not divide the 100 examples: batches straddle epochs."""
  full = _first_pixels(batching.train_dataset(_splits()[0], seed=5, global_batch_size=30,
                                              start_example=0), 35)
  resumed = _first_pixels(batching.train_dataset(_splits()[0], seed=5, global_batch_size=30,
                                                 start_example=start_step * 30), 35 - start_step)
  assert resumed == full[start_step:]


def test_eval_sees_every_example_once_with_a_partial_last_batch():
  batches = _first_pixels(batching.eval_dataset(_splits(n_test=23)[1], global_batch_size=10), 99)
  assert [len(b) for b in batches] == [10, 10, 3]
  assert sum(batches, []) == list(range(23))


def test_images_are_scaled_floats_with_a_channel():
  images, labels = next(iter(batching.eval_dataset(_splits()[1], global_batch_size=4)))
  assert images.shape == (4, 28, 28, 1) and images.dtype.name == "float32"
  assert float(images.numpy().max()) <= 1.0 and labels.numpy().tolist() == [0, 1, 2, 3]


class _Indexed:
  """The same examples as `_splits()[0]`, read on demand."""

  def __init__(self, arrays):
    self.arrays = arrays

  def __len__(self):
    return len(self.arrays)

  def __getitem__(self, indices):
    return self.arrays[indices]


def test_an_indexed_source_gets_the_batches_of_the_same_arrays_in_memory():
  from input_pipelines import sources  # pylint: disable=import-outside-toplevel
  train, _ = _splits()
  indexed = sources.as_source(_Indexed(train), "test")
  assert isinstance(indexed, sources.IndexedSource)
  in_memory = [(f.numpy()[:, 0, 0, 0] * 255).round().astype(int).tolist()
               for f, _ in batching.train_dataset(train, seed=3, global_batch_size=16,
                                                  start_example=0).take(8)]
  on_demand = [f.numpy()[:, 0, 0].astype(int).tolist()
               for f, _ in batching.train_dataset(indexed, seed=3, global_batch_size=16,
                                                  start_example=0).take(8)]
  assert on_demand == in_memory


class _BigExamples:
  """1 MiB examples; records how many rows each read asks for."""

  def __init__(self):
    self.reads = []

  def __len__(self):
    return 64

  def __getitem__(self, indices):
    self.reads.append(len(indices))
    return np.zeros((len(indices), 1 << 18), np.float32), np.zeros(len(indices), np.int64)


def test_big_examples_are_read_a_few_mib_at_a_time():
  """Reads in flight are AUTOTUNE'd: sized in rows alone, 256 big examples per read would
  hold hundreds of MiB, more the more cores the machine has."""
  from input_pipelines import sources  # pylint: disable=import-outside-toplevel
  big = _BigExamples()
  source = sources.as_source(big, "test")
  big.reads.clear()
  for _ in batching.train_dataset(source, seed=0, global_batch_size=2,
                                  start_example=0).take(6):
    pass
  assert big.reads and max(big.reads) <= 4, big.reads


@pytest.mark.parametrize("global_batch_size", [10, 300])  # 300: more rows than one read
def test_training_batches_have_their_size_when_traced(global_batch_size):
  """A batch of more rows than one read (256) came out of tf.numpy_function with an unknown
  size: the step was traced for any batch, and under XLA its per-example values' run-time
  length check failed the first step (`--config=recommender`, batch 2048)."""
  source = _splits(n_train=1000)[0]
  features, labels = batching.train_dataset(source, seed=0, global_batch_size=global_batch_size,
                                            start_example=0).element_spec
  assert features.shape[0] == labels.shape[0] == global_batch_size


def _noisy(features, labels, seed):
  """A random augmentation: noise from the stateless seed distloop passes in."""
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  return features + tf.random.stateless_uniform(tf.shape(features), seed), labels


def test_preprocess_is_random_per_example_yet_the_same_after_a_resume():
  train, _ = _splits()
  def stream(start_step, steps):
    dataset = batching.train_dataset(train, seed=4, global_batch_size=10,
                                     start_example=start_step * 10, preprocess=_noisy)
    return [features.numpy() for features, _ in dataset.take(steps)]
  full, resumed = stream(0, 25), stream(13, 12)
  for a, b in zip(full[13:], resumed):
    np.testing.assert_array_equal(a, b)
  assert full[0].shape == (10, 28, 28, 1)
  # An image is one value plus its noise: each example has noise of its own, and example k
  # has other noise when epoch 2 shows it again (the seed follows the position; batches of
  # other examples differ whatever the seeds).
  noise = [batch - batch[:, :1, :1, :] for batch in full]
  assert not np.allclose(noise[0][0], noise[0][1])
  ids = _first_pixels(batching.train_dataset(train, seed=4, global_batch_size=10,
                                             start_example=0), 20)
  k = ids[0][0]
  again = next((step, i) for step in range(10, 20) for i in range(10) if ids[step][i] == k)
  assert not np.allclose(noise[0][0], noise[again[0]][again[1]])


def test_a_stream_source_resumes_by_skipping_to_its_position():
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  from input_pipelines import sources  # pylint: disable=import-outside-toplevel
  stream = sources.as_source(
      lambda: tf.data.Dataset.range(7).map(lambda k: (tf.cast(k, tf.float32), k)), "test")
  def labels(start_example, steps):
    dataset = batching.train_dataset(stream, seed=0, global_batch_size=3,
                                     start_example=start_example)
    return [labels.numpy().tolist() for _, labels in dataset.take(steps)]
  assert labels(0, 4) == [[0, 1, 2], [3, 4, 5], [6, 0, 1], [2, 3, 4]]
  assert labels(6, 2) == [[6, 0, 1], [2, 3, 4]]
  eval_batches = [labels.numpy().tolist() for _, labels in batching.eval_dataset(stream, global_batch_size=3)]
  assert eval_batches == [[0, 1, 2], [3, 4, 5], [6]]


def test_the_order_is_index_shuffle_of_seed_and_epoch_per_position():
  """Position p reads row index_shuffle(p % N, [seed, p // N], N - 1): no N-sized array."""
  import tensorflow as tf
  from input_pipelines import order
  positions = np.arange(0, 250, dtype=np.int64)
  rows = order.rows(positions, 7, 100).numpy()
  expected = [int(tf.random.experimental.index_shuffle(p % 100, [7, p // 100], 99)) for p in positions]
  assert rows.tolist() == expected
  huge = order.rows(np.array([10**15 + 3], np.int64), 7, 10**9).numpy()  # N = 10^9 is fine
  assert 0 <= huge[0] < 10**9


class _Context:
  """A tf.distribute.InputContext stand-in: pipeline `id` of `pipelines`, `replicas` in all."""

  def __init__(self, pipelines, id_, replicas):
    self.num_input_pipelines, self.input_pipeline_id = pipelines, id_
    self.num_replicas_in_sync = replicas


def _per_replica(dataset, num_elements):
  return [np.round(images.numpy()[:, 0, 0, 0] * 255).astype(int).tolist()
          for images, _ in dataset.take(num_elements)]


@pytest.mark.parametrize("pipelines,replicas", [(1, 2), (2, 2), (2, 4), (3, 3)])
def test_each_input_pipeline_builds_its_replicas_share_of_every_global_batch(pipelines, replicas):
  source, steps, batch = _splits()[0], 7, 12
  full = _first_pixels(batching.train_dataset(source, seed=3, global_batch_size=batch,
                                              start_example=5), steps)
  local = replicas // pipelines
  shares = [_per_replica(batching.train_dataset(
      source, seed=3, global_batch_size=batch, start_example=5,
      input_context=_Context(pipelines, i, replicas)), steps * local) for i in range(pipelines)]
  for step in range(steps):
    # Replica r = pipeline * local + element % local, in order: the global batch, split.
    got = sum((shares[i][step * local + d] for i in range(pipelines) for d in range(local)), [])
    assert got == full[step]


@pytest.mark.parametrize("pipelines,replicas", [(1, 3), (3, 3), (2, 4)])
def test_eval_shares_cover_every_example_once_with_empty_slices(pipelines, replicas):
  source, batch = _splits(n_test=23)[1], 10  # batches 10, 10, 3: some replicas get nothing
  local = replicas // pipelines
  seen, sizes = [], []
  for i in range(pipelines):
    elements = _per_replica(batching.eval_dataset(
        source, global_batch_size=batch, input_context=_Context(pipelines, i, replicas)), 999)
    assert len(elements) == 3 * local  # every replica takes part in every eval step
    seen += sum(elements, [])
    sizes += [len(e) for e in elements]
  assert sorted(seen) == list(range(23)) and 0 in sizes


def test_arrays_in_memory_are_not_graph_constants():
  """The dataset's graph stays small however big the arrays are (no 2 GB GraphDef limit)."""
  big = Splits(np.zeros((20_000, 28, 28), np.uint8), np.zeros(20_000, np.int64),
               np.zeros((10, 28, 28), np.uint8), np.zeros(10, np.int64)).sources("test")[0]
  dataset = batching.train_dataset(big, seed=0, global_batch_size=8, start_example=0)
  graph_bytes = len(dataset._as_serialized_graph().numpy())  # pylint: disable=protected-access
  assert graph_bytes < 100_000 < big.features.nbytes


def _stream(n=100):
  """An opaque pipeline of examples whose labels are their index (images: index / 255)."""
  import tensorflow as tf
  from input_pipelines.sources import StreamSource
  def make():
    ids = tf.range(n, dtype=tf.int64)
    return tf.data.Dataset.from_tensor_slices(ids).map(
        lambda k: (tf.fill([28, 28, 1], tf.cast(k % 256, tf.float32) / 255.0), k))
  return StreamSource(make, where="test")


def _labels(dataset, num_batches):
  return [labels.numpy().tolist() for _, labels in dataset.take(num_batches)]


@pytest.mark.parametrize("start", [0, 30, 95, 210])
def test_an_opaque_pipeline_resumes_by_skipping_the_examples_used(start):
  """repeat() then skip(start): example p of the resumed stream is example p of the full one."""
  full = sum(_labels(batching.train_dataset(_stream(), seed=0, global_batch_size=30,
                                            start_example=0), 12), [])
  resumed = sum(_labels(batching.train_dataset(_stream(), seed=0, global_batch_size=30,
                                               start_example=start), 4), [])
  assert resumed == full[start:start + 120]
  assert full[:200] == [p % 100 for p in range(200)]  # the stream's own order, repeated


@pytest.mark.parametrize("pipelines,replicas", [(2, 2), (2, 4)])
def test_an_opaque_pipeline_splits_each_global_batch_over_workers(pipelines, replicas):
  full = _labels(batching.train_dataset(_stream(), seed=0, global_batch_size=12,
                                        start_example=7), 5)
  local = replicas // pipelines
  shares = [_labels(batching.train_dataset(_stream(), seed=0, global_batch_size=12,
                                           start_example=7,
                                           input_context=_Context(pipelines, i, replicas)),
                    5 * local) for i in range(pipelines)]
  for step in range(5):
    assert sum((shares[i][step * local + d] for i in range(pipelines) for d in range(local)),
               []) == full[step]


def test_an_opaque_eval_pipeline_counts_every_example_once():
  seen = []
  for i in range(2):
    seen += sum(_labels(batching.eval_dataset(_stream(23), global_batch_size=10,
                                              input_context=_Context(2, i, 4)), 99), [])
  assert sorted(seen) == list(range(23))
