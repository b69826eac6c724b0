"""`--mode=predict`: every row of a split scored once, in order, with the weights eval uses,
written in chunks committed with the position (trainer/state/predictions.py).

    output = predict.output (default model_dir/predictions/<step>/): refused if another
             model's, step's or source's; its committed chunks say where to go on
    batches = the rows from the first chunk not committed, predict.global_batch_size
              at a time, each replica its slice (input_pipelines/batching.py)
    for each batch:
        compiled: each replica's predict_step (or what export() serves), gathered on
                  every worker (one all-gather), in row order
        a chunk's rows complete -> the chief commits it; then one agreed check:
                  a signal on any worker stops every worker here, exit 42
    manifest.json (rows, columns, digest) written last

A rerun checks what it keeps (trainer/state/predictions.py): each committed chunk's
input rows are read again and must give the digest it recorded (the data changed:
refused), its files the SHA-256 it recorded (damaged: scored again).

What makes the bytes the same on any shape and after any stop: a chunk is a fixed
range of rows; a row's values depend on its example alone (the model in inference,
randomness a function of the row: PredictContext); every replica runs on a slice of
the same length (the last batch's repeat the last row, dropped on the host).
"""
import functools
import hashlib
import time

from absl import logging
import numpy as np
import tensorflow as tf

from input_pipelines import autograph_scope
from input_pipelines import batching
from input_pipelines.sources import StreamSource
from trainer.cluster import preemption
from trainer.errors import Preempted, UserError
from trainer.state import config_changes
from trainer.state import export
from trainer.store import files
from trainer.store import mirror
from trainer.store import model_dir as layout
from trainer.state import predictions
from trainer.task import user_code
from trainer.task.contexts import PredictContext

SPLITS = ("eval", "train")
_STRATEGIES = ("default", "one_device", "mirrored", "multi_worker_mirrored")


def output_dir(config, model_dir: str, step: int) -> str:
  return config.predict.output or layout.predictions_dir(model_dir, step)


def refuse_what_cannot_be_predicted(trainer) -> None:
  """UserError before any checkpoint is read: a strategy, a source or a Task that
  --mode=predict cannot write rows of."""
  config = trainer.config
  if config.runtime.strategy not in _STRATEGIES:
    raise UserError(f"--mode=predict runs on runtime.strategy={' | '.join(_STRATEGIES)}, "
                    f"not {config.runtime.strategy}")
  if isinstance(_source(trainer), StreamSource):
    raise UserError(f"--mode=predict needs a source that can be read by row; the "
                    f"{config.predict.split} split of data.name={config.data.name} is a "
                    f"tf.data stream (write it as records: python -m input_pipelines.convert)")
  _predict_function(trainer)


def _source(trainer):
  return trainer.eval_source if trainer.config.predict.split == "eval" else trainer.train_source


def predict(trainer, step: int) -> dict:
  """Scores predict.split with the weights of `step` (restored) into the output folder;
  the summary (rows, seconds, rows/s, the output, its digest)."""
  config = trainer.config
  split = config.predict.split
  source = _source(trainer)
  # A bucket's folder (predict.output a URL, or in a bucket model_dir): staged here,
  # with what the bucket holds of it; each file put there as it is committed.
  directory = files.staged_folder(output_dir(config, trainer.model_dir, step),
                                  "predict.output")
  run, _ = config_changes.model_dir_run(trainer.model_dir)
  identity = {"model": run, "checkpoint_step": step,
              "source": {"data": config.data.name, "split": split, "rows": len(source)}}
  inputs = input_digest(source, config.predict.global_batch_size)
  # The chief's folder decides, for every worker (a worker's disk may not hold it).
  done = predictions.finished(directory, identity, inputs) if trainer.is_chief else None
  if trainer.agreement.chiefs(int(done is not None)):
    logging.info("Already predicted: %s", directory)
    nothing = {"rows_scored": 0, "seconds": None, "rows_per_sec": None,
               "already_finished": True}
    return ({**_summary_of(done), **nothing} if done is not None
            else {**nothing, "output": mirror.display(directory)})
  output = predictions.open_output(directory, identity, num_rows=len(source),
                                   chunk_rows=config.predict.chunk_rows,
                                   writer=trainer.is_chief, inputs=inputs,
                                   lease_seconds=config.checkpoint.lease_seconds)
  try:
    return _score(trainer, source, output, step)
  finally:
    output.close()


def _score(trainer, source, output, step: int) -> dict:
  config, strategy = trainer.config, trainer.strategy
  chunk = trainer.agreement.chiefs(len(output.chunks))  # the chief's folder says where
  start = output.chunk_range(chunk)[0]
  batch_size = config.predict.global_batch_size
  dataset = strategy.distribute_datasets_from_function(
      lambda context: batching.predict_dataset(source, global_batch_size=batch_size,
                                               start=start, input_context=context))
  score = _compiled(strategy, _predict_function(trainer))
  name = type(trainer.task).__name__
  started, scored, buffered = time.perf_counter(), 0, []
  logging.info("Predicting %d rows of the %s split of %s with step %d on %d replica(s) "
               "(%s) into %s, from row %d", output.num_rows, config.predict.split,
               config.data.name, step, strategy.num_replicas_in_sync,
               config.runtime.strategy, output.directory, start)
  with trainer.serving.weights():
    for batch in dataset:
      if chunk >= output.num_chunks:
        break
      with user_code.running(f"{name}.predict_step", f"on rows from {start + scored}"):
        rows, keep, values, labels = score(batch)
      buffered.append(_columns(rows[keep], {n: v[keep] for n, v in values.items()},
                               labels, keep, name))
      first, end = output.chunk_range(chunk)
      have = sum(len(part[predictions.ROW_INDEX]) for part in buffered)
      while have >= end - first and chunk < output.num_chunks:
        columns, buffered = _split(buffered, end - first)
        if trainer.is_chief:
          output.commit(columns)
        scored += end - first
        chunk += 1
        _progress(output, start + scored, scored, time.perf_counter() - started)
        if trainer.agreement.any(preemption.requested()) and chunk < output.num_chunks:
          raise Preempted(None, message=(
              f"preempted after row {start + scored} of {output.num_rows}, committed in "
              f"{output.directory}: run the same command again to go on"))
        have -= end - first
        first, end = output.chunk_range(chunk)
  seconds = time.perf_counter() - started
  timing = {"rows_scored": scored, "seconds": seconds,
            "rows_per_sec": scored / max(seconds, 1e-9)}
  trainer.agreement.at_the_end()
  if trainer.is_chief:
    return {**_summary_of(output.finish()), **timing}
  return {"checkpoint_step": step, "rows": output.num_rows, **timing,
          "output": mirror.display(output.directory)}


def _summary_of(manifest: dict) -> dict:
  """What the summary line says of the output (its timings are this process's: they are
  in no file, so that a rerun writes the bytes of an uninterrupted run)."""
  keys = ("checkpoint_step", "rows", "digest")
  return {**{key: manifest.get(key) for key in keys}, "output_columns": list(manifest["columns"])}


def input_digest(source, batch_rows: int):
  """`digest(first, end)`: SHA-256 of rows [first, end) as the source reads them (every
  leaf, features and labels, undecoded: a records file's bytes), `batch_rows` at a time;
  what each committed chunk records of its input, and a rerun compares. The same for any
  batch size: each leaf's rows hashed on their own, then the leaves' specs and digests.
  Each range is read once: a finished output found damaged is checked by `finished`, then
  by `open_output`, with the same ranges."""
  specs = source.leaf_specs()

  @functools.cache
  def digest(first: int, end: int) -> str:
    leaves = [hashlib.sha256() for _ in specs]
    for start in range(first, end, batch_rows):
      rows = np.arange(start, min(start + batch_rows, end), dtype=np.int64)
      for hasher, leaf in zip(leaves, source.read_leaves(rows), strict=True):
        _hash_leaf(hasher, np.asarray(leaf))
    whole = hashlib.sha256(repr([(tuple(shape), str(dtype)) for shape, dtype in specs]).encode())
    for hasher in leaves:
      whole.update(hasher.digest())
    return whole.hexdigest()
  return digest


def _hash_leaf(hasher, leaf: np.ndarray) -> None:
  """A leaf's rows into `hasher`: its bytes, or for an object leaf (serialized records,
  rows of their own length) each row's size and bytes, so that no two rows run together."""
  if leaf.dtype.kind != "O":
    hasher.update(np.ascontiguousarray(leaf).data)
    return
  for item in leaf:
    if isinstance(item, bytes):
      hasher.update(len(item).to_bytes(8, "little"))
      hasher.update(item)
    else:
      value = np.ascontiguousarray(item)
      hasher.update(repr((value.dtype.str, value.shape)).encode())
      hasher.update(value.data)


def _progress(output, rows: int, scored: int, seconds: float) -> None:
  rate = scored / max(seconds, 1e-9)
  left = (output.num_rows - rows) / max(rate, 1e-9)
  logging.info("predict: %d/%d rows (%.0f%%) | %.0f rows/s | ETA %.0fs", rows,
               output.num_rows, 100.0 * rows / max(output.num_rows, 1), rate, left)


def _predict_function(trainer):
  """`fn((features, labels), rows) -> {name: [b, ...]}`: the Task's predict_step, else
  what its export() serves; UserError saying what to define if it has neither."""
  from trainer.task.contract import Task  # pylint: disable=g-import-not-at-top
  task, seed = trainer.task, trainer.config.runtime.seed
  name = type(task).__name__
  if type(task).predict_step is not Task.predict_step:
    step_fn = autograph_scope.user_function(task.predict_step)
    return lambda batch, rows: step_fn(batch, PredictContext(rows=rows, seed=seed))
  served = trainer.serving.served()
  if served is None:
    raise UserError(f"{name} has no predict_step and no export(): --mode=predict has no "
                    f"columns to write; define predict_step(batch, step) returning "
                    f"{{name: per-example values}} (docs/predict.md)")
  serve = export.serving_function(served)
  return lambda batch, rows: serve(batch[0])


def _compiled(strategy, function):
  """`score(batch) -> (rows, keep, {name: values}, labels)`, every replica's slice
  gathered in row order on every worker."""
  dtypes = []  # the values' own dtypes, as traced: the gather carries some widened

  def replica(rows, keep, features, labels):
    values = (rows, keep, _checked(function((features, labels), rows), rows), labels)
    dtypes[:] = [value.dtype for value in tf.nest.flatten(values)]
    # One all-gather: every replica (of every worker) holds the batch in replica order,
    # which is row order. (strategy.gather kept only the first replica's part, TF 2.21.)
    return tf.distribute.get_replica_context().all_gather(
        tf.nest.map_structure(_gatherable, values), axis=0)

  @tf.function
  def gathered(batch):
    return strategy.experimental_local_results(strategy.run(replica, args=batch))[0]

  def score(batch):
    values = gathered(batch)
    return tf.nest.pack_sequence_as(values, [
        value.numpy().astype(dtype.as_numpy_dtype, copy=False)
        for value, dtype in zip(tf.nest.flatten(values), dtypes)])
  return score


_GATHERED = (tf.float16, tf.float32, tf.float64, tf.int32, tf.int64)  # what all_gather takes


def _gatherable(value):
  """`value` in a dtype all_gather takes that holds it exactly (bool, small ints, bfloat16
  widened); the host casts it back."""
  if value.dtype in _GATHERED:  # a copy on the replica's device: a tensor straight from
    return tf.identity(value)   # the input has none, and MWMS's all_gather then fails
  if value.dtype.is_floating:
    return tf.cast(value, tf.float32)
  if value.dtype.is_integer or value.dtype == tf.bool:
    return tf.cast(value, tf.int64)
  raise UserError(f"a predicted value or label of dtype {value.dtype.name} cannot be "
                  f"gathered into rows; return numbers from predict_step")


def _checked(values, rows) -> dict:
  """The values as columns: a dict of per-example tensors of a fixed shape per row."""
  if not isinstance(values, dict) or not values:
    raise UserError(f"predict_step returned {type(values).__name__}: it must return "
                    f"{{name: per-example values}} (each [batch, ...])")
  checked = {}
  for name, value in values.items():
    value = tf.convert_to_tensor(value)
    if value.shape.rank == 0 or (value.shape[0] is not None and rows.shape[0] is not None
                                 and value.shape[0] != rows.shape[0]):
      raise UserError(f"the predicted value {name!r} has shape {value.shape.as_list()}, "
                      f"not [batch, ...] for a batch of {rows.shape[0]}: each value is one "
                      f"row per example")
    if any(dim is None for dim in value.shape[1:]):
      raise UserError(f"the predicted value {name!r} has shape {value.shape.as_list()}: "
                      f"a length that varies with the batch (padding) cannot be a column; "
                      f"return a fixed-size value per example from predict_step")
    checked[str(name)] = value
  return checked


def _columns(rows, values: dict, labels, keep, task_name: str) -> dict:
  columns = {predictions.ROW_INDEX: rows.astype(np.int64)}
  labelled = ({"label": labels} if not isinstance(labels, dict)
              else {f"label_{key}": value for key, value in labels.items()})
  for name, value in [*values.items(), *labelled.items()]:
    if name in columns:
      raise UserError(f"{task_name}: the column {name!r} is given twice (the row index is "
                      f"{predictions.ROW_INDEX!r}, labels 'label' or 'label_<key>'); "
                      f"rename the predicted value")
    columns[name] = value[keep] if name in labelled else value
  return columns


def _split(parts: list, count: int) -> tuple[dict, list]:
  """The first `count` rows of the buffered parts as one set of columns, and the rest."""
  joined = {name: np.concatenate([part[name] for part in parts]) for name in parts[0]}
  first = {name: column[:count] for name, column in joined.items()}
  rest = {name: column[count:] for name, column in joined.items()}
  return first, ([rest] if len(rest[predictions.ROW_INDEX]) else [])
