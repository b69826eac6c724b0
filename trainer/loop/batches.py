"""The training batches the loop reads: the global batch sequence from a data position,
each worker building only its replicas' shares of every global batch (parameter_server:
each worker its own salted order); a few real examples to build and check the task with
(the probe); and the iterator dropped off the main thread once the loop is over.

Why apart from the controller: the flow asks only for "the batches from this position"
(as it starts, after a rollback); the order is input_pipelines' (a pure function of seed
and position), the distribution the strategy's, wired here.
"""
import threading

import tensorflow as tf

from input_pipelines import batching
from input_pipelines.sources import Source
from trainer.loop import preprocess
from trainer.state.train_state import Position

PROBE_EXAMPLES = 8  # training examples the start-up checks and TensorBoard's samples use


class TrainBatches:
  """The training split as the loop reads it, with data.preprocess resolved (and checked:
  UserError) as this is made."""

  def __init__(self, config, source: Source):
    self._config = config
    self._source = source
    self.preprocess = preprocess.resolve(config.data.preprocess, source)  # None if unset

  def probe(self):
    """(a batch of the first training examples, the features' spec, the labels' spec):
    the task's input spec, the start-up checks, TensorBoard's samples. A spec has None
    wherever the data varies (data.pad_to): the model and the export take any length."""
    probe = self._dataset(start_example=0, stream="probe", global_batch_size=PROBE_EXAMPLES)
    batch = next(iter(probe))
    features_spec, labels_spec = batching.batch_spec(self._source, probe.element_spec, batch)
    return batch, features_spec, labels_spec

  def from_position(self, position: Position, strategy: tf.distribute.Strategy, coordinator, *,
                    decode_on_device: bool):
    """An iterator of the global batches from `position` on; `decode_on_device`: uint8
    across, scaled by the step."""
    if coordinator:
      # Asynchronous workers cannot split one stream exactly: each reads its own
      # order of the data (a per-worker salt), from the checkpointed position.
      return iter(coordinator.create_per_worker_dataset(
          lambda: self._dataset(start_example=position.examples, salted=True,
                                decode_on_device=decode_on_device)))
    # Each worker builds only its replicas' shares of every global batch.
    return iter(strategy.distribute_datasets_from_function(
        lambda input_context: self._dataset(start_example=position.examples,
                                            input_context=input_context,
                                            decode_on_device=decode_on_device)))

  def _dataset(self, *, start_example: int, global_batch_size: int | None = None,
               salted: bool = False, input_context=None, stream: str = "train",
               decode_on_device: bool = False) -> tf.data.Dataset:
    return batching.train_dataset(
        self._source, seed=self._config.runtime.seed,
        global_batch_size=global_batch_size or self._config.train.global_batch_size,
        start_example=start_example, preprocess=self.preprocess, salted=salted,
        input_context=input_context, stream=stream, decode_on_device=decode_on_device)


TEARDOWNS = []  # threads dropping training iterators (see dropped_off_the_main_thread)


def dropped_off_the_main_thread(iterator) -> None:
  """Drops the training iterator in a thread of its own: its teardown waits for tf.data's
  threads (1-3 s on a quiet machine, 20-80 s on a busy one: issue 31) and nothing after
  the loop needs it; the CLI leaves (os._exit) without waiting for it, the Python API
  waits for it before it returns (join_teardowns)."""
  held = [iterator]
  del iterator
  thread = threading.Thread(target=held.clear, name="distloop: training iterator teardown",
                            daemon=True)
  thread.start()
  TEARDOWNS.append(thread)


def join_teardowns() -> None:
  """Waits for the iterators dropped off the main thread (the Python API, before it returns:
  a teardown still running when the interpreter finalizes could deadlock it)."""
  while TEARDOWNS:
    TEARDOWNS.pop().join()
