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
