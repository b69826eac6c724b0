"""`data.name='records'`: converted data on disk (`data.dir` = the converter's --output).

Nothing is loaded: `build` reads manifest.json and checks every shard's size
and record count (input_pipelines/records/manifest.py), then decodes the first record
of each split against the manifest's feature spec (in Python: a multi-worker
runtime must not start before its strategy), so a folder that is not
converted data, a shard that is missing, truncated or does not match the
manifest, or a spec that does not fit the records is one line (exit 2) before
training starts.

A `RecordSource` reads only the rows it is asked for: the rows of a batch,
grouped by shard, each shard's in file order, through shared thread-safe
readers (input_pipelines/records/shards.py); decoding (`features.decode`) runs in
TensorFlow on the batch. Record k of a split is example k of the input it was
converted from, so the trajectory is the one of that input in memory.
"""
import os

import ml_collections
import numpy as np

from input_pipelines.errors import DataError
from input_pipelines.records import features as features_lib
from input_pipelines.records import manifest as manifest_lib
from input_pipelines.records import shards
from input_pipelines.sources import IndexableSource


class RecordSource(IndexableSource):
  """One split of a converted dataset, read by row."""

  def __init__(self, directory: str, manifest: manifest_lib.Manifest, split: str, *,
               where: str):
    super().__init__(where)
    self.manifest = manifest
    shard_list = manifest.splits[split]
    self._readers = shards.Readers([os.path.join(directory, s["file"]) for s in shard_list])
    self._starts = np.cumsum([0] + [s["num_records"] for s in shard_list])
    self._bytes = sum(s["bytes"] for s in shard_list)
    keys = features_lib.feature_keys(manifest.features, manifest.label)
    self.feature_name = keys[0] if len(keys) == 1 else "inputs"

  def __len__(self) -> int:
    return int(self._starts[-1])

  def leaf_specs(self):
    return [((), np.dtype(object))]  # the serialized records

  def class_count(self):
    """The classes the converter recorded: image_folder's class folders, or the count of
    class ids of IDX/npz labels; None when the manifest says neither."""
    classes = self.manifest.metadata.get("classes")
    if classes:
      return len(classes), f"{self.where}: {len(classes)} classes in its manifest"
    count = self.manifest.metadata.get("num_classes")
    if count:
      return int(count), f"{self.where}: class ids 0..{int(count) - 1} in its manifest"
    return None

  def example_bytes(self) -> int:
    return int(self._bytes // max(1, len(self)))

  def read_leaves(self, rows):
    rows = np.asarray(rows, dtype=np.int64)
    if rows.size and (rows.min() < 0 or rows.max() >= len(self)):
      raise DataError(f"{self.where}: rows {rows.min()}..{rows.max()} outside 0..{len(self) - 1}")
    shard_of = np.searchsorted(self._starts, rows, side="right") - 1
    records = np.empty(len(rows), dtype=object)
    for shard in np.unique(shard_of):
      mine = np.flatnonzero(shard_of == shard)
      positions = rows[mine] - self._starts[shard]
      in_file_order = np.argsort(positions, kind="stable")
      got = self._readers.read(int(shard), positions[in_file_order].tolist())
      for slot, record in zip(mine[in_file_order], got):
        records[slot] = record
    return [records]

  def assemble(self, leaves):
    return features_lib.decode(self.manifest.features, self.manifest.label, leaves[0])

  def check_first_record(self) -> None:
    """DataError unless the first record fits the manifest's feature spec."""
    problem = features_lib.problem_with(self.manifest.features,
                                        self.read_leaves(np.zeros(1, np.int64))[0][0])
    if problem:
      raise DataError(f"{self.where}: the first record does not fit the manifest's feature "
                      f"spec: {problem}")


def build(data_config: ml_collections.ConfigDict, seed: int):
  """(train, eval) RecordSources of data.dir; checked, nothing loaded."""
  del seed  # the records fix the data; the seed only orders it (input_pipelines/order.py)
  directory = data_config.dir
  if not directory:
    raise DataError("data.dir: empty; data.name='records' reads the folder that "
                    "python -m input_pipelines.convert --output=DIR wrote")
  manifest = manifest_lib.read(directory)
  manifest_lib.check_shards(directory, manifest)
  sources = tuple(RecordSource(directory, manifest, split,
                               where=f"data.name='records' {split} split ({directory})")
                  for split in manifest_lib.SPLITS)
  for source in sources:
    source.check_first_record()
  return sources
