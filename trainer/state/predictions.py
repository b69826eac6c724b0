"""The predictions folder (`--mode=predict`): chunks committed with the position, so a
stopped or killed job that runs again writes each row once, the same bytes.

    OUTPUT/
      progress.json                 the identity (model, checkpoint step, source), the
                                    chunk size, and each committed chunk (its files'
                                    SHA-256, its input rows' digest): written last for
                                    each chunk, atomically (the position)
      parquet/part-KKKKK-of-NNNNN.parquet   chunk K's rows (Apache Parquet, pyarrow)
      records/train-KKKKK-of-NNNNN.array_record  the same rows as distloop records
      records/manifest.json         written at the end: a records folder to train from
      manifest.json                 written last: the run's identity, rows, columns and
                                    a digest of every chunk; a folder with it is complete

Chunk k holds rows [k*C, (k+1)*C) of the source (C: predict.chunk_rows), in order,
whatever the batch size or the replica and worker count, so its bytes are a function of
the model and the data alone. Committing a chunk: its Parquet file and its records
shard are written under temporary names and renamed, then progress.json names it. A
kill before that leaves files no progress.json names: the next run removes them and
writes the chunk again; after it, the chunk is never written again. Only the chief
writes; a folder holding another model's, step's or source's predictions is refused.

A rerun checks what it keeps: each committed chunk's input rows, read again, must give
the digest it recorded (else the data changed: refused, never mixed), and its files the
SHA-256 it recorded (else the chunk, damaged, and those after it are scored again).
"""
from collections.abc import Callable
import dataclasses
import hashlib
import json
import os

from absl import logging
import numpy as np

from input_pipelines.records import manifest as records_manifest
from input_pipelines.records import shards
from trainer.errors import StorageError, UserError
from trainer.store import files
from trainer.store import storage

FORMAT = "distloop-predictions/1"
PROGRESS = "progress.json"
MANIFEST = "manifest.json"
PARQUET = "parquet"
RECORDS = "records"
ROW_INDEX = "index"  # the column of each row's index in the source


@dataclasses.dataclass
class Output:
  """An open predictions folder: `rows_done` committed rows, the chunks still to write."""
  directory: str
  identity: dict
  num_rows: int
  chunk_rows: int
  chunks: list  # the committed chunks' entries, in order
  inputs: Callable[[int, int], str]  # (first, end) -> the digest of those input rows
  _lock: files.FolderLock | None = None

  @property
  def num_chunks(self) -> int:
    return max(1, -(-self.num_rows // self.chunk_rows))

  @property
  def rows_done(self) -> int:
    return sum(chunk["rows"] for chunk in self.chunks)

  def chunk_range(self, index: int) -> tuple[int, int]:
    return index * self.chunk_rows, min((index + 1) * self.chunk_rows, self.num_rows)

  def commit(self, columns: dict) -> dict:
    """Writes the next chunk (`columns`: name -> numpy array of its rows, `index` first),
    then names it in progress.json, with its files' SHA-256 and its input rows' digest:
    from then on it is part of the output."""
    index = len(self.chunks)
    first, end = self.chunk_range(index)
    rows = columns[ROW_INDEX]
    if not np.array_equal(rows, np.arange(first, end)):  # each row once, in order
      raise AssertionError(f"chunk {index}: rows {rows[:1]}..{rows[-1:]} ({len(rows)}) are "
                           f"not {first}..{end - 1}")
    inputs = self.inputs(first, end)  # the source's rows read again (its errors, not ours)
    name = f"part-{index:05d}-of-{self.num_chunks:05d}"
    parquet_path = os.path.join(self.directory, PARQUET, f"{name}.parquet")
    committed = f"rows 0..{first - 1} are committed" if first else "no row is committed yet"
    what = f"chunk {index} of the predictions (rows {first}..{end - 1}; {committed})"
    try:
      parquet = _stage_parquet(parquet_path, columns)
      records = _write_records(os.path.join(self.directory, RECORDS,
                                            shards.name("train", index, self.num_chunks)),
                               columns)
      entry = {"rows": int(len(rows)), "input": inputs, "parquet": parquet,
               "records": records, "columns": _column_specs(columns)}
      # The commit: the files in place first, then progress.json names them.
      files.commit(files.temporary(parquet_path), parquet_path, what=what, where=self.directory)
      files.published(os.path.join(self.directory, RECORDS, records["file"]))
      _write_json(os.path.join(self.directory, PROGRESS), self._progress([*self.chunks, entry]),
                  what=what, where=self.directory)
    except StorageError:  # the store's one line (exit 1)
      _remove_uncommitted(self)
      raise
    except (OSError, RuntimeError, ValueError) as e:  # a full disk: one line (exit 1)
      if storage.reason(e) is None:
        raise
      _remove_uncommitted(self)
      raise storage.failure(what, self.directory, e) from None
    self.chunks.append(entry)
    return entry

  def finish(self) -> dict:
    """The manifests, once every chunk is committed: records/manifest.json (a records
    folder whose both splits are the predictions, label = the first output column) and
    manifest.json, written last. Both are a function of the chunks alone (no timings):
    a stopped and rerun output is the same bytes as an uninterrupted one, every file."""
    specs = self.chunks[0]["columns"] if self.chunks else {}
    names = [name for name in specs if name != ROW_INDEX]
    if self.chunks and names:
      shard_list = [chunk["records"] for chunk in self.chunks]
      records_manifest.write(os.path.join(self.directory, RECORDS), records_manifest.Manifest(
          {name: _record_spec(spec) for name, spec in specs.items()}, names[0],
          {"train": shard_list, "eval": shard_list},
          {"from": "distloop --mode=predict", **self.identity}, self.digest()))
      files.published(os.path.join(self.directory, RECORDS, records_manifest.NAME))
    manifest = {"format": FORMAT, **self.identity, "rows": self.rows_done,
                "chunk_rows": self.chunk_rows, "columns": specs, "digest": self.digest(),
                "parquet": [chunk["parquet"]["file"] for chunk in self.chunks],
                "records": RECORDS}
    _write_json(os.path.join(self.directory, MANIFEST), manifest)
    return manifest

  def digest(self) -> str:
    """SHA-256 over every chunk's Parquet and records SHA-256, in order."""
    digest = hashlib.sha256()
    for chunk in self.chunks:
      digest.update(chunk["parquet"]["sha256"].encode())
      digest.update(chunk["records"]["sha256"].encode())
    return digest.hexdigest()

  def close(self) -> None:
    if self._lock is not None:
      lock, self._lock = self._lock, None
      lock.release()

  def _progress(self, chunks=None) -> dict:
    return {"format": FORMAT, "identity": self.identity, "num_rows": self.num_rows,
            "chunk_rows": self.chunk_rows, "chunks": self.chunks if chunks is None else chunks}


def finished(directory: str, identity: dict, inputs: Callable[[int, int], str]
             ) -> dict | None:
  """The manifest of a complete folder of these predictions; None if not complete, or if
  a chunk's files are damaged (open_output then scores it again). UserError if it holds
  another model's, step's or source's, or chunks scored on other input rows."""
  path = os.path.join(directory, MANIFEST)
  if not os.path.isfile(path):
    return None
  manifest = _read_json(path)
  _check_identity(directory, {key: manifest.get(key) for key in identity}, identity)
  chunks = list(_read_json(os.path.join(directory, PROGRESS)).get("chunks") or [])
  _check_inputs(directory, chunks, manifest.get("chunk_rows"), inputs)
  return manifest if _first_damaged(directory, chunks) is None else None


def open_output(directory: str, identity: dict, *, num_rows: int, chunk_rows: int,
                writer: bool, inputs: Callable[[int, int], str],
                lease_seconds: float = 60.0) -> Output:
  """The folder to continue (progress.json's committed chunks) or to start; refused in
  one line (UserError) if it holds anything else, or chunks scored on other input rows
  (`inputs(first, end)`: the digest of those rows now). `writer` (the chief): the folder
  locked, made, a damaged chunk and those after it dropped (a warning), and the files of
  chunks never committed removed. Another worker reads nothing (its disk may not hold the
  folder): the chief's count is agreed on. In a bucket (trainer/store/files.py
  `staged_folder`) the lock is a lease of `lease_seconds`."""
  if not writer:
    return Output(directory, identity, num_rows, chunk_rows, [], inputs)
  progress_path = os.path.join(directory, PROGRESS)
  chunks = []
  if os.path.isfile(progress_path):
    progress = _read_json(progress_path)
    _check_identity(directory, progress.get("identity") or {}, identity)
    if progress.get("chunk_rows") != chunk_rows:
      raise UserError(f"predict.output={directory} holds chunks of "
                      f"{progress.get('chunk_rows')} rows: continue with "
                      f"--config.predict.chunk_rows={progress.get('chunk_rows')}, or choose "
                      f"another predict.output")
    chunks = list(progress.get("chunks") or [])
    _check_inputs(directory, chunks, chunk_rows, inputs)
  elif os.path.isdir(directory) and _contents(directory):
    raise UserError(f"predict.output={directory} is not empty and holds no predictions "
                    f"(no {PROGRESS}); choose an empty or new folder")
  output = Output(directory, identity, num_rows, chunk_rows, chunks, inputs)
  try:
    for sub in (PARQUET, RECORDS):
      os.makedirs(os.path.join(directory, sub), exist_ok=True)
  except OSError as e:
    raise UserError(f"predict.output={directory} cannot be made: {e.strerror or e}") from None
  output._lock = _lock(directory, lease_seconds)  # pylint: disable=protected-access
  _drop_damaged(output)
  _remove_uncommitted(output)
  if not os.path.isfile(progress_path):  # from now on the folder says whose it is
    _write_json(progress_path, output._progress())  # pylint: disable=protected-access
  return output


def _check_inputs(directory: str, chunks: list, chunk_rows: int,
                  inputs: Callable[[int, int], str]) -> None:
  """UserError naming the first committed chunk whose input rows, read now, do not give
  the digest it recorded: scored on other data than the source holds now."""
  for index, chunk in enumerate(chunks):
    first = index * chunk_rows
    end = first + chunk["rows"]
    if chunk.get("input") != inputs(first, end):
      raise UserError(f"predict.output={directory}: chunk {index} (rows {first}..{end - 1}) "
                      f"was scored on other input rows than the source holds now (the data "
                      f"changed since); remove the folder, or choose another "
                      f"predict.output, to score every row on the new data")


def _first_damaged(directory: str, chunks: list) -> tuple[int, str] | None:
  """(index, file) of the first committed chunk with a file missing or not the bytes
  its SHA-256 in progress.json says; None if every one is whole."""
  for index, chunk in enumerate(chunks):
    for sub, kind in ((PARQUET, "parquet"), (RECORDS, "records")):
      path = os.path.join(directory, sub, chunk[kind]["file"])
      if not os.path.isfile(path) or shards.file_sha256(path) != chunk[kind]["sha256"]:
        return index, os.path.join(sub, chunk[kind]["file"])
  return None


def _drop_damaged(output: Output) -> None:
  """A damaged committed chunk and those after it leave the output (warned, one line):
  the manifests go first (the folder is no longer complete), then progress.json names
  the chunks before it; their files are then uncommitted, removed, and scored again."""
  damaged = _first_damaged(output.directory, output.chunks)
  if damaged is None:
    return
  index, file = damaged
  first, end = output.chunk_range(index)
  logging.warning("predict.output=%s: %s of chunk %d (rows %d..%d) is missing or damaged "
                  "(not the SHA-256 progress.json recorded): scoring rows %d.. again",
                  output.directory, file, index, first, end - 1, first)
  for path in (os.path.join(output.directory, MANIFEST),
               os.path.join(output.directory, RECORDS, records_manifest.NAME)):
    if os.path.exists(path):
      files.remove(path)
  output.chunks = output.chunks[:index]
  _write_json(os.path.join(output.directory, PROGRESS), output._progress())  # pylint: disable=protected-access


def _check_identity(directory: str, found: dict, wanted: dict) -> None:
  for key, value in wanted.items():
    if found.get(key) != value:
      raise UserError(f"predict.output={directory} holds the predictions of another "
                      f"{key.replace('_', ' ')} ({found.get(key)!r}, this run "
                      f"{value!r}); choose another predict.output, or remove it")


def _lock(directory: str, lease_seconds: float) -> files.FolderLock:
  return files.lock_folder(
      directory, f"predict.output={directory} is being written by another --mode=predict; "
                 f"wait for it to end, or choose another predict.output",
      lease_seconds=lease_seconds)


def _remove_uncommitted(output: Output) -> None:
  """Files a stop or kill left that progress.json does not name (a chunk written but not
  committed, a temporary): they are written again."""
  kept = {chunk["parquet"]["file"] for chunk in output.chunks}
  kept |= {chunk["records"]["file"] for chunk in output.chunks}
  for sub in (PARQUET, RECORDS):
    folder = os.path.join(output.directory, sub)
    for name in os.listdir(folder):
      if name not in kept and name != records_manifest.NAME:
        files.remove(os.path.join(folder, name))


def _contents(directory: str) -> list[str]:
  return [name for name in os.listdir(directory) if name != ".lock"]


# -- the formats -------------------------------------------------------------------------

def _column_specs(columns: dict) -> dict:
  """name -> {"dtype", "shape" (per row)}: what manifest.json says of each column."""
  return {name: {"dtype": array.dtype.name, "shape": list(array.shape[1:])}
          for name, array in columns.items()}


def _stage_parquet(path: str, columns: dict) -> dict:
  """`columns` as one Parquet file at `path`'s temporary name (the commit renames it), a
  column each: a number per row, or a row's values flattened as a fixed-size list (its
  shape in the field's metadata)."""
  import pyarrow as pa  # pylint: disable=g-import-not-at-top
  import pyarrow.parquet as pq  # pylint: disable=g-import-not-at-top
  arrays, fields = [], []
  for name, array in columns.items():
    array = np.ascontiguousarray(array)
    if array.ndim == 1:
      arrow = pa.array(array)
    else:
      size = int(np.prod(array.shape[1:]))
      arrow = pa.FixedSizeListArray.from_arrays(pa.array(array.reshape(-1)), size)
    arrays.append(arrow)
    fields.append(pa.field(name, arrow.type, nullable=False,
                           metadata={"shape": json.dumps(list(array.shape[1:]))}))
  table = pa.Table.from_arrays(arrays, schema=pa.schema(fields))
  temporary = files.temporary(path)
  pq.write_table(table, temporary, compression="zstd")  # fsynced by the commit
  return {"file": os.path.basename(path), "bytes": os.path.getsize(temporary),
          "sha256": shards.file_sha256(temporary)}


def _write_records(path: str, columns: dict) -> dict:
  """One records shard of `columns`' rows (written, read back and checked, renamed)."""
  writer = shards.Writer(path, compress=False)
  try:
    encode = _record_encoder(columns)
    for row in range(len(columns[ROW_INDEX])):
      writer.write(encode(row))
    return writer.close()
  except BaseException:
    writer.discard()
    raise


def _record_spec(column: dict) -> dict:
  return {"encoding": "raw", "dtype": column["dtype"], "shape": column["shape"]}


def _record_encoder(columns: dict):
  """`encode(row) -> bytes`: row `row` of `columns` as a tf.train.Example (records format,
  every column stored raw: its exact bytes)."""
  from input_pipelines.records import features  # pylint: disable=g-import-not-at-top
  encode = features.encoder({name: _record_spec(spec)
                             for name, spec in _column_specs(columns).items()})
  return lambda row: encode({name: array[row] for name, array in columns.items()})


# -- small files -------------------------------------------------------------------------

def _write_json(path: str, value: dict, **where) -> None:
  files.write_json(path, value, indent=1, sort_keys=False, **where)  # the columns in order


def _read_json(path: str) -> dict:
  try:
    with open(path, encoding="utf-8") as f:
      value = json.load(f)
  except (OSError, ValueError) as e:
    raise UserError(f"{path}: not readable ({str(e).splitlines()[0][:200]}); remove the "
                    f"folder to predict again") from None
  if not isinstance(value, dict) or value.get("format") != FORMAT:
    raise UserError(f"{path}: not distloop predictions (format {FORMAT!r}); choose another "
                    f"predict.output")
  return value
