"""TensorBoard event files under model_dir/tensorboard/{train,eval}; chief only.

Written eagerly at loop boundaries, never from inside the compiled loop. Writers
are opened on first use, so constructing this writes nothing.
"""
import os

import tensorflow as tf


class Summaries:

  def __init__(self, model_dir: str, *, enabled: bool):
    self._root = os.path.join(model_dir, "tensorboard")
    self._enabled = enabled
    self._writers = {}

  def scalars(self, split: str, step: int, values: dict) -> None:
    if not self._enabled:
      return
    if split not in self._writers:
      self._writers[split] = tf.summary.create_file_writer(os.path.join(self._root, split))
    with self._writers[split].as_default(step=step):
      for tag, value in values.items():
        tf.summary.scalar(tag, value)

  def flush(self) -> None:
    for writer in self._writers.values():
      writer.flush()

  def close(self) -> None:
    for writer in self._writers.values():
      writer.close()
    self._writers = {}
