"""TensorBoard event files under model_dir/tensorboard/{train,eval}; chief only.

Written at loop boundaries, never from inside the compiled loop, so the loop pays
nothing for them. Scalars are kept and written together, in one compiled call, once a
second at most (and at every flush and the close): one call per boundary cost a tiny
model as much as its steps (docs/performance.md, "The loop boundary"). Writers are
opened on first use, so constructing this writes nothing. What each tag means is in
docs/monitoring.md.

A write that fails for the storage's sake (a full disk, a read-only file system: a
TensorFlow OpError naming the OS error, when a writer is created, written, flushed or
closed) is the one-line StorageError every other model_dir write gives (exit 1), not
a traceback; the writers are then dropped, so the close in the run's `finally` does not
fail a second time over the same disk.
"""
import contextlib
import json
import math
import os
import struct
import time

from absl import logging
import numpy as np
import tensorflow as tf
from tensorboard.compat.proto import event_pb2
from tensorboard.compat.proto import summary_pb2
from tensorboard.compat.proto import tensor_pb2
from tensorboard.compat.proto import tensor_shape_pb2
from tensorboard.compat.proto import types_pb2
from tensorboard.plugins.hparams import api as hparams_api
from tensorboard.plugins.scalar import metadata as scalar_metadata

from trainer.errors import StorageError
from trainer.reporters.contract import Reporter
from trainer.store import files
from trainer.store import model_dir as layout
from trainer.store import storage

_SAMPLE_IMAGES = 8
# What tf.summary.scalar attaches: TensorBoard's Scalars tab shows the value.
_SCALAR_METADATA = scalar_metadata.create_summary_metadata(display_name=None, description=None)
_SCALAR_SHAPE = tensor_shape_pb2.TensorShapeProto()
_SECONDS_BETWEEN_WRITES = 1.0  # kept scalars are written at least this often
_MOST_ROWS_KEPT = 500
_EVENTS_QUEUED = 100_000  # more than a second's rows of every tag: written at each flush
_ROWS_WRITTEN_EAGERLY = 2  # fewer rows than a trace of the compiled writer costs (~0.15 s)


class Summaries(Reporter):
  """runtime.loggers' `tensorboard` (contract.py), and TensorBoard's own extras: the
  config and model as text, sample inputs, the step graph."""

  writes_model_dir = True  # the store's writer: a full disk is the run's failure
  can_rewind = True  # restart_at drops the events past the step

  def __init__(self, model_dir: str, *, enabled: bool):
    self.root = layout.tensorboard_dir(model_dir)
    self._enabled = enabled
    self._writers = {}
    self._scalar_writers = {}  # (split, tags) -> compiled writer
    self._kept = {}  # (split, tags) -> [(step, [value per tag])], not written yet
    self._last_write = -float("inf")

  def _writer(self, split: str):
    if split not in self._writers:
      # Events queue in memory until _write_kept flushes them (once a second at most): the
      # default queue of 10 meant a write to the file every 10 scalars.
      with self._storage_failures(split):  # it writes the file's first event at once
        self._writers[split] = tf.summary.create_file_writer(
            files.library_folder(os.path.join(self.root, split), "TensorBoard"),
            max_queue=_EVENTS_QUEUED, flush_millis=10_000)
    return self._writers[split]

  @contextlib.contextmanager
  def _storage_failures(self, split: str):
    """A full disk (or the like) under tensorboard/SPLIT as the one line, the writers
    dropped; anything else propagates as it is (a bug, not the disk's fault)."""
    try:
      yield
    except (tf.errors.OpError, OSError) as error:
      if storage.reason(error) is None:
        raise
      self._drop_writers()
      raise storage.failure(f"the TensorBoard {split} events", os.path.join(self.root, split),
                            error) from None

  def _drop_writers(self) -> None:
    """Forgets every writer and kept row, closing each writer quietly (what they held
    cannot be written anyway); later calls write nothing."""
    writers, self._writers, self._scalar_writers, self._kept = self._writers, {}, {}, {}
    self._enabled = False
    for writer in writers.values():
      try:
        writer.close()
      except (tf.errors.OpError, OSError):
        pass

  def restart_at(self, step: int) -> None:
    """TensorBoard shows each step once: the events past `step` (the step restored) that
    a killed or rolled back run logged are dropped from the event files under
    tensorboard/{train,eval}, as metrics_log.restart_at drops its rows; the steps
    trained again are then logged once, in this run's own file. Only a file holding
    events past `step` is rewritten (same name). On a bucket model_dir the event files
    are fetched first, and the rewritten ones put back whole."""
    if not self._enabled:
      return
    self._kept = {split: [row for row in rows if row[0] <= step]
                  for split, rows in self._kept.items()}
    if self._writers:  # a rollback: the file being written is one to rewrite
      self.flush()
      self._drop_writers()
      self._enabled = True
    for split in ("train", "eval"):
      directory = os.path.join(self.root, split)
      with self._storage_failures(split):
        files.fetch_logs(directory)
        for name in sorted(os.listdir(directory)) if os.path.isdir(directory) else []:
          if name.startswith("events.out.tfevents."):
            _drop_events_past(os.path.join(directory, name), step,
                              f"the TensorBoard {split} events")

  def rewind(self, step: int) -> None:
    self.restart_at(step)

  def write(self, step: int, split: str, values: dict) -> None:
    self.scalars(split, step, values)

  def finish(self, summary: dict, export_dir: str | None) -> None:
    self.flush()

  def scalars(self, split: str, step: int, values: dict) -> None:
    """Keeps this step's scalars; writes what is kept once a second at most."""
    if not self._enabled:
      return
    self._kept.setdefault(split, []).append((step, _scalars_event(values)))
    if (time.monotonic() - self._last_write >= _SECONDS_BETWEEN_WRITES
        or sum(len(rows) for rows in self._kept.values()) >= _MOST_ROWS_KEPT):
      self._write_kept()

  def _write_kept(self) -> None:
    """Every kept row, one compiled call per split: eager summary ops (one dispatch per
    row) cost more than the rest of a boundary together, a call per row still about as
    much as a tiny model's 50 steps, and an event per scalar (tf.summary.write) five
    times what one event per row costs."""
    kept, self._kept = self._kept, {}
    for split, rows in kept.items():
      with self._storage_failures(split):
        if len(rows) <= _ROWS_WRITTEN_EAGERLY and split not in self._scalar_writers:
          with self._writer(split).as_default():  # a short run's only rows, an eval's
            for step, event in rows:
              tf.summary.experimental.write_raw_pb(event, step=step)
        else:
          self._scalar_writer(split)(tf.constant([step for step, _ in rows], tf.int64),
                                     tf.constant([event for _, event in rows], tf.string))
        self._writer(split).flush()  # on disk within a second, as before
    self._last_write = time.monotonic()

  def _scalar_writer(self, split: str):
    """A compiled `write(steps [k], events [k])`: serialized Summary i at steps[i]."""
    write = self._scalar_writers.get(split)
    if write is None:
      writer = self._writer(split)

      @tf.function(autograph=False, input_signature=[
          tf.TensorSpec([None], tf.int64), tf.TensorSpec([None], tf.string)])
      def write(steps, events):
        def write_row(i):
          with writer.as_default():
            tf.summary.experimental.write_raw_pb(events[i], step=steps[i])
          return (i + 1,)
        tf.while_loop(lambda i: i < tf.shape(steps)[0], write_row, (tf.constant(0),))
      self._scalar_writers[split] = write
    return write

  def describe_run(self, step: int, config: dict) -> None:
    """The resolved config, as text and as hparams (the hparams plugin compares runs)."""
    if not self._enabled:
      return
    flat = flatten_config(config)
    with self._storage_failures("train"), self._writer("train").as_default(step=step):
      rows = "\n".join(f"| `{key}` | `{value}` |" for key, value in flat.items())
      tf.summary.text("config", "| field | value |\n| --- | --- |\n" + rows)
      hparams_api.hparams(flat, trial_id=os.path.dirname(self.root))

  def text(self, step: int, tag: str, markdown: str) -> None:
    """A markdown text in TensorBoard's Text tab (train run)."""
    if not self._enabled:
      return
    with self._storage_failures("train"), self._writer("train").as_default(step=step):
      tf.summary.text(tag, markdown)

  def sample_images(self, step: int, images: np.ndarray) -> None:
    """A few training inputs as the model sees them (once, at the start of a run)."""
    if not self._enabled:
      return
    with self._storage_failures("train"), self._writer("train").as_default(step=step):
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
      if not self._enabled:  # a failed write inside the block dropped the writers
        tf.summary.trace_off()
      else:
        with self._storage_failures("train"), self._writer("train").as_default(step=step):
          tf.summary.trace_export("train_loop", step=step)

  def flush(self) -> None:
    if self._kept:
      self._write_kept()
    for split, writer in list(self._writers.items()):
      with self._storage_failures(split):
        writer.flush()

  def close(self, *, quiet: bool = False) -> None:
    """Writes what is kept and closes the writers. `quiet`: a storage failure is a
    warning (the run is ending with another error, the one to report)."""
    try:
      if self._kept:
        self._write_kept()
      for split, writer in list(self._writers.items()):
        with self._storage_failures(split):
          writer.close()
        del self._writers[split]
      self._scalar_writers = {}
    except StorageError as e:
      if not quiet:
        raise
      logging.warning("%s", e)


def looks_like_images(features) -> bool:
  """TensorBoard's input samples: only for one [b, H, W, 1|3|4] array of features."""
  return (tf.is_tensor(features) and features.shape.rank == 4 and features.shape[-1] in (1, 3, 4)
          and (features.dtype.is_floating or features.dtype == tf.uint8))


def _drop_events_past(path: str, step: int, what: str) -> None:
  """Rewrites the event file `path` without its events past `step` (and a record cut
  short at its end: a killed writer's), if it has any (`what` names it in the one-line
  error of a full disk). A TFRecord is
  `length (8 bytes), its CRC (4), data, the data's CRC (4)`: the records kept are
  copied as they are."""
  with open(path, "rb") as f:
    data = f.read()
  kept, at, past = [], 0, False
  while at + 12 <= len(data):
    length = struct.unpack("<Q", data[at:at + 8])[0]
    end = at + 12 + length + 4
    if end > len(data):
      break
    if event_pb2.Event.FromString(data[at + 12:end - 4]).step > step:
      past = True
    else:
      kept.append(data[at:end])
    at = end
  if past:
    files.write_bytes(path, b"".join(kept), what=what)  # whole, and to the bucket


def _scalars_event(values: dict) -> bytes:
  """One serialized Summary holding every scalar of a row, as tf.summary.scalar writes
  each (a float32 tensor with the scalar plugin's metadata): the same bytes as
  TensorBoard's `summary_v2.scalar_pb` per tag (tests/outputs/test_tensorboard.py). A Summary's
  repeated values serialize one after the other, and a tag's bytes differ only in the
  float's 4, so each tag is serialized once and a row is spliced from those: building
  the protos at every boundary cost 25 us, scalar_pb's 5x that."""
  row = []
  for tag, value in values.items():
    parts = _VALUE_PARTS.get(tag)
    if parts is None:
      parts = _VALUE_PARTS[tag] = _value_parts(tag)
    if parts is _UNSPLICED:
      row.append(_value_summary(tag, value).SerializeToString())
    else:
      row += (parts[0], _float32_bytes(value), parts[1])
  return b"".join(row)


_VALUE_PARTS = {}  # tag -> (the bytes before its float32, after it), or _UNSPLICED
_UNSPLICED = ()
_MARKER = 1.2345678  # its float32 bytes (52 06 9e 3f) are not ASCII: found once, in the value


def _value_summary(tag: str, value: float):
  return summary_pb2.Summary(value=[summary_pb2.Summary.Value(
      tag=tag, metadata=_SCALAR_METADATA, tensor=tensor_pb2.TensorProto(
          dtype=types_pb2.DT_FLOAT, tensor_shape=_SCALAR_SHAPE, float_val=[float(value)]))])


def _value_parts(tag: str):
  whole, marker = _value_summary(tag, _MARKER).SerializeToString(), _float32_bytes(_MARKER)
  if whole.count(marker) != 1:  # a tag holding those bytes: serialized row by row
    return _UNSPLICED
  at = whole.index(marker)
  return whole[:at], whole[at + len(marker):]


def _float32_bytes(value) -> bytes:
  """float32, little-endian, as protobuf stores a float field: beyond its range, +-inf."""
  value = float(value)
  try:
    return struct.pack("<f", value)
  except OverflowError:
    return struct.pack("<f", math.copysign(math.inf, value))


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
