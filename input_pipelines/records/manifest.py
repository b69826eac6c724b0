"""manifest.json: the index of a converted dataset -- its shards, their checks, its features.

    {"format": "distloop-records/1",
     "features": {key: spec, ...}, "label": key,     (input_pipelines/records/features.py)
     "splits": {"train": [shard, ...], "eval": [shard, ...]},
     "metadata": {"from": ..., "input": ..., ...},   (what it was converted from)
     "fingerprint": ...}                              (of the input; the converter's resume key)

where each shard is {"file", "num_records", "bytes", "sha256"}, in record order:
record k of a split is the k-th record of its shards laid end to end. Written
last, atomically, by the converter: a folder with a manifest is complete.

`check_shards` (every start of a run): every shard is there, with its size, and
opens with its record count -- cheap, no full read. `verify` re-hashes every
byte (`python -m input_pipelines.convert --verify=DIR`).
"""
import dataclasses
import json
import os

from input_pipelines.errors import DataError
from input_pipelines.records import features as features_lib
from input_pipelines.records import shards

NAME = "manifest.json"
FORMAT = "distloop-records/1"
SPLITS = ("train", "eval")
_SHARD_KEYS = {"file": str, "num_records": int, "bytes": int, "sha256": str}


@dataclasses.dataclass
class Manifest:
  features: dict
  label: str
  splits: dict  # split -> [shard dict]
  metadata: dict
  fingerprint: str

  def num_records(self, split: str) -> int:
    return sum(shard["num_records"] for shard in self.splits[split])

  def to_json(self) -> dict:
    return {"format": FORMAT, "features": self.features, "label": self.label,
            "splits": self.splits, "metadata": self.metadata, "fingerprint": self.fingerprint}


def path_of(directory: str) -> str:
  return os.path.join(directory, NAME)


def read(directory: str) -> Manifest:
  """The manifest of `directory`, checked for shape; DataError naming what is wrong."""
  path = path_of(directory)
  if not os.path.isdir(directory):
    raise DataError(f"data.dir {directory!r} does not exist or is not a directory")
  if not os.path.isfile(path):
    raise DataError(f"{path}: missing, so {directory} is not converted data (or its "
                    f"conversion did not finish): run python -m input_pipelines.convert")
  try:
    with open(path, encoding="utf-8") as f:
      raw = json.load(f)
  except (OSError, UnicodeDecodeError, ValueError) as e:
    raise DataError(f"{path}: not readable JSON ({str(e).splitlines()[0][:200]})") from None
  if not isinstance(raw, dict) or raw.get("format") != FORMAT:
    raise DataError(f"{path}: not a distloop manifest (format "
                    f"{raw.get('format') if isinstance(raw, dict) else None!r}, "
                    f"expected {FORMAT!r})")
  label = raw.get("label")
  spec = features_lib.check(raw.get("features"), label, path)
  splits = raw.get("splits")
  if not isinstance(splits, dict) or set(splits) != set(SPLITS):
    raise DataError(f"{path}: 'splits' must hold exactly {' and '.join(SPLITS)}")
  for split, shard_list in splits.items():
    if not isinstance(shard_list, list) or not shard_list:
      raise DataError(f"{path}: split {split!r} lists no shards")
    for shard in shard_list:
      if (not isinstance(shard, dict) or set(shard) != set(_SHARD_KEYS) or
          not all(isinstance(shard[k], t) for k, t in _SHARD_KEYS.items())):
        raise DataError(f"{path}: split {split!r} has a malformed shard entry {shard!r}")
      if os.path.basename(shard["file"]) != shard["file"]:
        raise DataError(f"{path}: shard {shard['file']!r} must be a file name in {directory}")
  manifest = Manifest(spec, label, splits, raw.get("metadata") or {},
                      str(raw.get("fingerprint", "")))
  for split in SPLITS:
    if manifest.num_records(split) == 0:
      raise DataError(f"{path}: split {split!r} has no records")
  return manifest


def write(directory: str, manifest: Manifest) -> None:
  """Atomically: a reader sees no manifest or a complete one."""
  temporary = path_of(directory) + ".tmp"
  with open(temporary, "w", encoding="utf-8") as f:
    json.dump(manifest.to_json(), f, indent=1)
    f.flush()
    os.fsync(f.fileno())
  os.replace(temporary, path_of(directory))


def check_shards(directory: str, manifest: Manifest) -> None:
  """Every shard is present, of its size, and opens with its record count."""
  where = path_of(directory)
  for split in SPLITS:
    for shard in manifest.splits[split]:
      path = os.path.join(directory, shard["file"])
      if not os.path.isfile(path):
        raise DataError(f"{path}: missing (listed in {where})")
      size = os.path.getsize(path)
      if size != shard["bytes"]:
        raise DataError(f"{path}: {size} bytes, but {where} says {shard['bytes']}: the "
                        f"shard does not match its manifest (truncated or replaced)")
      reader = shards.open_reader(path)
      try:
        count = reader.num_records()
      finally:
        reader.close()
      if count != shard["num_records"]:
        raise DataError(f"{path}: {count} records, but {where} says "
                        f"{shard['num_records']}: the shard does not match its manifest")


def verify(directory: str, manifest: Manifest) -> list[str]:
  """Problems found by re-hashing every shard (empty: all match)."""
  problems = []
  for split in SPLITS:
    for shard in manifest.splits[split]:
      path = os.path.join(directory, shard["file"])
      if not os.path.isfile(path):
        problems.append(f"{path}: missing")
      elif shards.file_sha256(path) != shard["sha256"]:
        problems.append(f"{path}: SHA-256 differs from the manifest (corrupt or replaced)")
  return problems
