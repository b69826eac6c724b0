"""TensorBoard event files under model_dir/tensorboard/{train,eval}; chief only.

Written eagerly at loop boundaries, never from inside the compiled loop, so the
loop pays nothing for them. Writers are opened on first use, so constructing
this writes nothing. What each tag means is in README.md ("Monitoring").
"""
import contextlib
import json
import os

import numpy as np
import tensorflow as tf
from tensorboard.plugins.hparams import api as hparams_api

from trainer.state import model_dir as layout

_SAMPLE_IMAGES = 8


class Summaries:

  def __init__(self, model_dir: str, *, enabled: bool):
    self.root = layout.tensorboard_dir(model_dir)
    self._enabled = enabled
    self._writers = {}
    self._scalar_writers = {}  # (split, tags) -> compiled writer

  def _writer(self, split: str):
    if split not in self._writers:
      self._writers[split] = tf.summary.create_file_writer(os.path.join(self.root, split))
    return self._writers[split]

  def scalars(self, split: str, step: int, values: dict) -> None:
    """One compiled call writes every scalar: at a loop boundary, eager summary ops
    (one dispatch per tag) cost more than the rest of the boundary together."""
    if not self._enabled:
      return
    tags = tuple(values)
    write = self._scalar_writers.get((split, tags))
    if write is None:
      writer = self._writer(split)

      @tf.function(autograph=False)
      def write(step, vector):
        with writer.as_default(step=step):
          for i, tag in enumerate(tags):
            tf.summary.scalar(tag, vector[i])
      self._scalar_writers[split, tags] = write
    write(tf.constant(step, tf.int64),
          tf.constant([float(value) for value in values.values()], tf.float32))

  def describe_run(self, step: int, config: dict) -> None:
    """The resolved config, as text and as hparams (the hparams plugin compares runs)."""
    if not self._enabled:
      return
    flat = flatten_config(config)
    with self._writer("train").as_default(step=step):
      rows = "\n".join(f"| `{key}` | `{value}` |" for key, value in flat.items())
      tf.summary.text("config", "| field | value |\n| --- | --- |\n" + rows)
      hparams_api.hparams(flat, trial_id=os.path.dirname(self.root))

  def text(self, step: int, tag: str, markdown: str) -> None:
    """A markdown text in TensorBoard's Text tab (train run)."""
    if not self._enabled:
      return
    with self._writer("train").as_default(step=step):
      tf.summary.text(tag, markdown)

  def sample_images(self, step: int, images: np.ndarray) -> None:
    """A few training inputs as the model sees them (once, at the start of a run)."""
    if not self._enabled:
      return
    with self._writer("train").as_default(step=step):
      tf.summary.image("input_samples", images[:_SAMPLE_IMAGES], max_outputs=_SAMPLE_IMAGES)

  @contextlib.contextmanager
  def graph_of_first_call(self, step: int):
    """Records the graph of the tf.function first traced inside the block."""
    if not self._enabled:
      yield
      return
    tf.summary.trace_on(graph=True, profiler=False)
    try:
      yield
    finally:
      with self._writer("train").as_default(step=step):
        tf.summary.trace_export("train_loop", step=step)

  def flush(self) -> None:
    for writer in self._writers.values():
      writer.flush()

  def close(self) -> None:
    for writer in self._writers.values():
      writer.close()
    self._writers = {}
    self._scalar_writers = {}


def flatten_config(config: dict, prefix: str = "") -> dict:
  """{'train.steps': 300, ...}: hparams take scalars; anything else becomes its JSON text."""
  flat = {}
  for key, value in config.items():
    name = f"{prefix}{key}"
    if isinstance(value, dict):
      flat.update(flatten_config(value, name + "."))
    elif isinstance(value, (bool, int, float, str)):
      flat[name] = value
    else:
      flat[name] = json.dumps(value)
  return flat
