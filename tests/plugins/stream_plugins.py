"""An opaque tf.data pipeline as a data plug-in (test_opaque_pipeline.py): the training split
is a callable returning a shuffled tf.data.Dataset, rebuilt the same every time."""
import numpy as np

from input_pipelines.datasets import synthetic


def shuffled_stream(data_config, seed):
  splits = synthetic.build(data_config, seed)
  images = (splits.train_images.astype(np.float32) / 255.0)[..., None]
  labels = splits.train_labels

  def make_dataset():
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    # A fixed-seed shuffle is deterministic: every build yields the same elements in order.
    return tf.data.Dataset.from_tensor_slices((images, labels)).shuffle(len(labels), seed=seed)

  eval_images = (splits.test_images.astype(np.float32) / 255.0)[..., None]
  return make_dataset, (eval_images, splits.test_labels)


def _empty(data_config, seed):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  del data_config, seed
  return lambda: tf.data.Dataset.from_tensor_slices(
      (tf.zeros([0, 28, 28, 1]), tf.zeros([0], tf.int64)))


def empty_eval_stream(data_config, seed):
  """The training split in memory, the eval split a stream that yields nothing."""
  splits = synthetic.build(data_config, seed)
  images = (splits.train_images.astype(np.float32) / 255.0)[..., None]
  return (images, splits.train_labels), _empty(data_config, seed)


def empty_train_stream(data_config, seed):
  """The training split a stream that yields nothing."""
  splits = synthetic.build(data_config, seed)
  eval_images = (splits.test_images.astype(np.float32) / 255.0)[..., None]
  return _empty(data_config, seed), (eval_images, splits.test_labels)
