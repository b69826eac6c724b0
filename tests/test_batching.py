"""The data position: the batch order is a pure function of (seed, epoch) and the step."""
import numpy as np
import pytest

from input_pipelines import batching
from input_pipelines.splits import Splits


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
  # Epoch 2 shows example k again, with other noise: the seed follows the position.
  assert not np.array_equal(full[0], full[10]) and full[0].shape == (10, 28, 28, 1)


def test_a_stream_source_resumes_by_skipping_to_its_position():
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  from input_pipelines import sources  # pylint: disable=import-outside-toplevel
  stream = sources.as_source(
      lambda: tf.data.Dataset.range(7).map(lambda k: (tf.cast(k, tf.float32), k)), "test")
  def labels(start_example, steps):
    dataset = batching.train_dataset(stream, seed=0, global_batch_size=3,
                                     start_example=start_example)
    return [l.numpy().tolist() for _, l in dataset.take(steps)]
  assert labels(0, 4) == [[0, 1, 2], [3, 4, 5], [6, 0, 1], [2, 3, 4]]
  assert labels(6, 2) == [[6, 0, 1], [2, 3, 4]]
  eval_batches = [l.numpy().tolist() for _, l in batching.eval_dataset(stream, global_batch_size=3)]
  assert eval_batches == [[0, 1, 2], [3, 4, 5], [6]]
