"""One shard file of converted records: written, verified, opened for random reads.

The format is array_record (the format behind TFDS data sources and grain):
each file carries its own index of record offsets in its footer, and every
block and chunk a hash, so a truncated or corrupt file is an error when it is
opened or read, not silently wrong data. Written with group_size:1 (each record
its own chunk) so one record is read without decompressing its neighbours;
compression (zstd) is per record and optional.

Readers: one `ArrayRecordReader` per shard, shared by every tf.data thread
(array_record's reader is thread-safe, as grain and TFDS use it), opened on
first use with readahead off (reads are random).
"""
import hashlib
import os
import threading

from input_pipelines.errors import DataError

SUFFIX = ".array_record"
_HASH_CHUNK = 1 << 22


def name(split: str, index: int, count: int) -> str:
  return f"{split}-{index:05d}-of-{count:05d}{SUFFIX}"


def _module():
  from array_record.python import array_record_module  # pylint: disable=g-import-not-at-top
  return array_record_module


class Writer:
  """Writes `records` to `path` via a temporary file, checks them back, then renames.

  What `close()` checks: the file opens, holds as many records as were written,
  and reading them all back gives the same SHA-256 as the records written.
  """

  def __init__(self, path: str, compress: bool):
    self.path = path
    self._temporary = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.tmp")
    options = "group_size:1" + ("" if compress else ",uncompressed")
    self._writer = _module().ArrayRecordWriter(self._temporary, options)
    self._digest = hashlib.sha256()
    self.num_records = 0

  def write(self, record: bytes) -> None:
    self._writer.write(record)
    self._digest.update(record)
    self.num_records += 1

  def close(self) -> dict:
    """Verifies and publishes the shard; {file, num_records, bytes, sha256} of it."""
    self._writer.close()
    reader = open_reader(self._temporary)
    try:
      got = reader.num_records()
      digest = hashlib.sha256()
      for start in range(0, got, 1024):
        for record in reader.read(start, min(start + 1024, got)):
          digest.update(record)
    finally:
      reader.close()
    if got != self.num_records or digest.digest() != self._digest.digest():
      raise OSError(f"{self._temporary}: wrote {self.num_records} records, read back {got} "
                    f"{'with other contents' if got == self.num_records else ''}")
    os.replace(self._temporary, self.path)
    return {"file": os.path.basename(self.path), "num_records": got,
            "bytes": os.path.getsize(self.path), "sha256": file_sha256(self.path)}

  def discard(self) -> None:
    try:
      self._writer.close()
    except Exception:  # pylint: disable=broad-except  (already failed; removing it anyway)
      pass
    if os.path.exists(self._temporary):
      os.remove(self._temporary)


def open_reader(path: str):
  """A random-access reader; DataError naming the file if it is missing or corrupt."""
  if not os.path.isfile(path):
    raise DataError(f"{path}: shard file not found")
  try:
    reader = _module().ArrayRecordReader(path, "readahead_buffer_size:0",
                                         file_reader_buffer_size=32768)
    ok = reader.ok()
  except (RuntimeError, ValueError, OSError) as e:
    raise DataError(f"{path}: cannot open the shard (corrupt or truncated: "
                    f"{_first_line(e)})") from None
  if not ok:
    raise DataError(f"{path}: cannot open the shard (corrupt or truncated)")
  return reader


def file_sha256(path: str) -> str:
  digest = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(_HASH_CHUNK), b""):
      digest.update(block)
  return digest.hexdigest()


class Readers:
  """Lazily opened, shared readers of a list of shard files."""

  def __init__(self, paths: list[str]):
    self.paths = paths
    self._readers = [None] * len(paths)
    self._lock = threading.Lock()

  def read(self, shard: int, positions: list[int]) -> list[bytes]:
    reader = self._readers[shard]
    if reader is None:
      with self._lock:
        if self._readers[shard] is None:
          self._readers[shard] = open_reader(self.paths[shard])
        reader = self._readers[shard]
    try:
      return reader.read(positions)
    except (RuntimeError, IndexError, ValueError) as e:
      raise DataError(f"{self.paths[shard]}: cannot read records "
                      f"{min(positions)}..{max(positions)} ({_first_line(e)})") from None


def _first_line(error: Exception) -> str:
  text = str(error).strip()
  return (text.splitlines()[0] if text else type(error).__name__)[:300]
