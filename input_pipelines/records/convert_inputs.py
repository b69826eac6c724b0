"""What the converter reads: each input format as a feature spec and splits of records.

An `Input` says everything the converter needs before it writes anything: the
feature spec and label key (input_pipelines/records/features.py), the number of
examples of each split, a way to iterate its serialized records from any
example on (to resume a conversion), and a fingerprint of the input (paths,
sizes, modification times, options), so a re-run knows it is converting the
same thing. Building an Input reads or lists the input and checks it: bad input
is a DataError here, before the output folder exists.

Formats, and the readers they reuse:
  idx           a folder of the four MNIST IDX files (input_pipelines/datasets/mnist.py)
  npz           an mnist.npz-style file (x_train, y_train, x_test, y_test)
  csv           a table: a .csv/.npz file or a folder with train.csv/test.csv
                (input_pipelines/datasets/table.py; --label names the label
                column); a CSV is read in chunks (input_pipelines/datasets/
                csv_rows.py): once to check every cell and count the rows, then
                again per split as it is written, so memory holds a chunk (and
                which rows are held out)
  image_folder  data.dir/train/<class>/<image> [and test/] (input_pipelines/
                datasets/image_folder.py); the encoded files are stored, decoded
                when read
  tfrecord      TFRecord files of tf.train.Example (--input and --eval_input
                globs, --features the spec, --label its label key); copied as is
"""
import dataclasses
import functools
import glob
import hashlib
import json
import os
import re
from typing import Callable, Iterator

import ml_collections
import numpy as np

from input_pipelines.datasets import csv_rows
from input_pipelines.datasets import option_names
from input_pipelines.errors import DataError
from input_pipelines.records import features as features_lib
from input_pipelines.records import progress as progress_lib

_VALIDATE_BATCH = 256  # TFRecord records parsed at a time while converting


@dataclasses.dataclass
class Options:
  """The converter's flags that some formats read."""
  eval_input: str = ""
  features: str = ""  # tfrecord: the spec, JSON or @file.json
  label: str = "label"  # csv: the label column; tfrecord: the label key
  eval_fraction: float = 0.2
  seed: int = 0
  image_size: int = 32
  channels: int = 3
  show_progress: bool = True  # csv: a bar on stderr while every cell is checked


@dataclasses.dataclass
class Split:
  num_examples: int
  records: Callable[[int], Iterator[bytes]]  # serialized examples from example `start` on


@dataclasses.dataclass
class Input:
  features: dict
  label: str
  splits: dict  # "train", "eval" -> Split
  metadata: dict
  fingerprint: str


def _fingerprint(fmt: str, paths: list[str], options: dict) -> str:
  described = [(p, os.path.getsize(p), os.stat(p).st_mtime_ns) for p in sorted(paths)]
  text = json.dumps({"from": fmt, "files": described, "options": options}, sort_keys=True)
  return hashlib.sha256(text.encode()).hexdigest()


def _example_split(spec: dict, num_examples: int, example: Callable[[int], dict]) -> Split:
  """A split whose example i is `example(i)`, encoded one at a time."""
  def records(start: int):
    encode = features_lib.encoder(spec)
    for i in range(start, num_examples):
      yield encode(example(i))
  return Split(num_examples, records)


def _array_split(spec: dict, columns: dict) -> Split:
  """A split of equal-length numpy arrays {key: [N, ...]}."""
  return _example_split(spec, len(next(iter(columns.values()))),
                        lambda i: {key: array[i] for key, array in columns.items()})


def from_examples(spec: dict, label: str, splits: dict, *, fingerprint: str,
                  metadata: dict | None = None) -> Input:
  """Your own data, in Python: `splits` = {"train": (N, example), "eval": (M, example)},
  `example(i) -> {key: numpy array}` (an image's encoded bytes for encoding "image");
  `fingerprint` names this data (a re-run with another one is refused). Write it with
  `input_pipelines.records.convert.convert(from_examples(...), output_dir)`."""
  spec = features_lib.check(spec, label, "from_examples")
  if set(splits) != {"train", "eval"}:
    raise DataError(f"from_examples: splits must be 'train' and 'eval', got {sorted(splits)}")
  return Input(spec, label, {name: _example_split(spec, n, fn) for name, (n, fn) in splits.items()},
               {"from": "python", **(metadata or {})}, fingerprint)


def idx(path: str, options: Options, fmt: str = "idx") -> Input:
  from input_pipelines.datasets import mnist  # pylint: disable=g-import-not-at-top
  splits = mnist.load_files(path)
  spec = features_lib.check({
      "images": {"encoding": "raw", "dtype": "uint8", "shape": [28, 28, 1], "cast": "float32",
                 "scale": 255},
      "labels": {"encoding": "int64", "shape": []}}, "labels", f"--from={fmt}")
  files = ([path] if os.path.isfile(path) else
           [os.path.join(path, f) for f in os.listdir(path)
            if "idx" in f or f.endswith("mnist.npz")])
  del options
  return Input(spec, "labels", {
      "train": _array_split(spec, {"images": splits.train_images, "labels": splits.train_labels}),
      "eval": _array_split(spec, {"images": splits.test_images, "labels": splits.test_labels})},
      {"from": fmt, "input": os.path.abspath(path),
       # class ids 0..N-1: a model's class count can come from the data (model.num_classes=0)
       "num_classes": int(max(splits.train_labels.max(), splits.test_labels.max())) + 1},
      _fingerprint(fmt, files, {}))


def npz(path: str, options: Options) -> Input:
  if not (os.path.isfile(path) and path.endswith(".npz")):
    raise DataError(f"{path}: --from=npz takes an .npz file (x_train, y_train, x_test, y_test)")
  return idx(path, options, fmt="npz")


def csv(path: str, options: Options) -> Input:
  from input_pipelines.datasets import table  # pylint: disable=g-import-not-at-top
  names = option_names.CONVERTER
  train_path, test_path = table.files(path, names)
  if not all(p.endswith(".csv") for p in (train_path, test_path) if p):
    return _npz_table(path, options)
  headers = []  # (file, its columns): both headers checked before any file is read through
  train_features = None  # the train file's, read first
  for file in (train_path, test_path):
    if file is not None:
      columns = csv_rows.read_header(file)
      features = table.feature_columns(file, columns, options.label, names)
      if headers:  # the test file: train's features (stored in train's order)
        table.check_same_columns(file, features, os.path.basename(train_path), train_features)
      else:
        train_features = features
      headers.append((file, columns))
  tables = [_CsvFile(file, columns, train_features, _count_rows(file, columns,
                                                                options.show_progress))
            for file, columns in headers]
  spec = features_lib.check({"features": {"encoding": "float", "shape": [len(train_features)]},
                             "label": {"encoding": "float", "shape": []}}, "label", "--from=csv")
  if test_path is None:  # a seeded share of the rows held out, as table.py holds it out
    held_out = table.held_out_rows(train_path, tables[0].count, options.eval_fraction,
                                   options.seed, names)
    splits = {"train": tables[0].split(spec, options.label, ~held_out),
              "eval": tables[0].split(spec, options.label, held_out)}
  else:
    splits = {"train": tables[0].split(spec, options.label),
              "eval": tables[1].split(spec, options.label)}
  return Input(spec, "label", splits,
               {"from": "csv", "input": os.path.abspath(path),
                "feature_columns": tables[0].features},
               _fingerprint("csv", [p for p in (train_path, test_path) if p],
                            {"label": options.label, "eval_fraction": options.eval_fraction,
                             "seed": options.seed}))


@dataclasses.dataclass
class _CsvFile:
  path: str
  columns: list
  features: list  # the feature columns, in the order they are stored
  count: int  # data rows

  def split(self, spec: dict, label: str, rows: np.ndarray | None = None) -> Split:
    """A split of this file's rows (those where the mask `rows` is True), read in chunks."""
    feature_index = [self.columns.index(n) for n in self.features]
    label_index = self.columns.index(label)
    return Split(int(self.count if rows is None else rows.sum()),
                 functools.partial(_csv_records, self.path, self.columns, feature_index,
                                   label_index, spec, rows))


def _csv_records(path, columns, feature_index, label_index, spec, rows, start):
  """The split's serialized examples from its example `start` on, a chunk at a time."""
  encode = features_lib.encoder(spec)
  seen = file_row = 0  # the split's examples passed; the file's rows passed
  for chunk in csv_rows.chunks(path, columns):
    if rows is not None:
      if file_row + len(chunk) > len(rows):
        raise DataError(f"{path}: has more rows than when it was checked (changed meanwhile?)")
      chunk, file_row = chunk[rows[file_row:file_row + len(chunk)]], file_row + len(chunk)
    if seen + len(chunk) <= start:
      seen += len(chunk)
      continue
    chunk = chunk[max(0, start - seen):]
    seen = max(seen, start)
    features = np.ascontiguousarray(chunk[:, feature_index])
    labels = chunk[:, label_index].copy()
    for i in range(len(chunk)):
      yield encode({"features": features[i], "label": labels[i]})
    seen += len(chunk)


def _count_rows(path: str, columns: list, show_progress: bool) -> int:
  """The data rows of a CSV, every cell checked (a bad one is a DataError naming its line and
  column), with a bar on stderr."""
  with progress_lib.file_bar(path, "checking", enabled=show_progress) as bar:
    count = sum(len(chunk) for chunk in csv_rows.chunks(path, columns, on_read=bar.reached))
  if count == 0:
    raise DataError(f"{path}: no rows after the header")
  return count


def _npz_table(path: str, options: Options) -> Input:
  """A table in .npz files: read whole (an .npz is not read in parts)."""
  from input_pipelines.datasets import table  # pylint: disable=g-import-not-at-top
  config = ml_collections.ConfigDict({"dir": path, "label_column": options.label,
                                      "eval_fraction": options.eval_fraction})
  (train_path, train), (eval_path, evaluation) = table.load_files(
      config, options.seed, names=option_names.CONVERTER)
  num_features = train[0].shape[1]
  spec = features_lib.check({"features": {"encoding": "float", "shape": [num_features]},
                             "label": {"encoding": "float", "shape": []}}, "label", "--from=csv")
  files = [p for p in (train_path, eval_path) if os.path.isfile(p)]
  columns = None
  if train_path.endswith(".csv"):  # a train.csv beside a test.npz
    columns = table.feature_columns(train_path, csv_rows.read_header(train_path), options.label,
                                    option_names.CONVERTER)
  return Input(spec, "label", {
      "train": _array_split(spec, {"features": train[0], "label": train[1]}),
      "eval": _array_split(spec, {"features": evaluation[0], "label": evaluation[1]})},
      {"from": "csv", "input": os.path.abspath(path), "feature_columns": columns},
      _fingerprint("csv", files, {"label": options.label, "eval_fraction": options.eval_fraction,
                                  "seed": options.seed}))


def image_folder(path: str, options: Options) -> Input:
  from input_pipelines.datasets import image_folder as folder  # pylint: disable=g-import-not-at-top
  config = ml_collections.ConfigDict({"dir": path, "image_size": options.image_size,
                                      "channels": options.channels,
                                      "eval_fraction": options.eval_fraction})
  train, evaluation = folder.build(config, options.seed, option_names.CONVERTER)
  spec = features_lib.check({
      "images": {"encoding": "image", "shape": [options.image_size, options.image_size,
                                                options.channels],
                 "cast": "float32", "scale": 255},
      "labels": {"encoding": "int64", "shape": []}}, "labels", "--from=image_folder")

  def split(source) -> Split:
    def records(start: int):
      encode = features_lib.encoder(spec)
      for i in range(start, len(source)):
        yield encode({"images": _checked_image(source.paths[i]), "labels": source.labels[i]})
    return Split(len(source), records)
  return Input(spec, "labels", {"train": split(train), "eval": split(evaluation)},
               {"from": "image_folder", "input": os.path.abspath(path), "classes": train.classes},
               _fingerprint("image_folder", train.paths + evaluation.paths,
                            {"size": options.image_size, "channels": options.channels,
                             "eval_fraction": options.eval_fraction, "seed": options.seed}))


def _checked_image(path: str) -> bytes:
  """The file's bytes, once Pillow has decoded them: a broken image fails the conversion
  (naming it), not a training run hours later."""
  from PIL import Image  # pylint: disable=g-import-not-at-top
  with open(path, "rb") as f:
    data = f.read()
  try:
    with Image.open(path) as image:
      image.load()
  except Exception as e:  # pylint: disable=broad-except  (Pillow raises many kinds)
    raise DataError(f"{path}: cannot be decoded as an image ({type(e).__name__}: "
                    f"{str(e).strip()[:200]})") from None
  return data


def tfrecord(path: str, options: Options) -> Input:
  if not options.features:
    raise DataError("--from=tfrecord needs --features: the feature spec as JSON (or "
                    "@file.json), e.g. {\"image\": {\"encoding\": \"image\", \"shape\": "
                    "[28, 28, 1]}, \"label\": {\"encoding\": \"int64\", \"shape\": []}}")
  if not options.eval_input:
    raise DataError("--from=tfrecord needs --eval_input: the eval split's TFRecord files")
  spec = features_lib.check(_json_option(options.features), options.label, "--features")
  train_files, eval_files = _files(path, "--input"), _files(options.eval_input, "--eval_input")
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  def split(files: list[str]) -> Split:
    dataset = tf.data.TFRecordDataset(files, compression_type=_compression(files))
    try:
      count = int(dataset.reduce(np.int64(0), lambda n, _: n + 1))
    except tf.errors.OpError as e:
      raise DataError(f"{', '.join(files)[:200]}: not readable as TFRecord files "
                      f"({_op_message(e)})") from None
    if count == 0:
      raise DataError(f"{', '.join(files)[:200]}: no records")

    def records(start: int):
      index = start
      batches = dataset.skip(start).batch(_VALIDATE_BATCH)
      try:
        for batch in batches:
          try:  # each record must parse and decode with the spec
            features_lib.decode(spec, options.label, batch)
          except (tf.errors.OpError, ValueError) as e:
            raise DataError(f"records {index}..{index + len(batch) - 1} of {', '.join(files)[:200]} "
                            f"do not fit --features ({_op_message(e)})") from None
          for record in batch.numpy():
            yield bytes(record)
          index += len(batch)
      except tf.errors.OpError as e:
        raise DataError(f"{', '.join(files)[:200]}: cannot read record {index} "
                        f"({_op_message(e)})") from None
    return Split(count, records)
  return Input(spec, options.label, {"train": split(train_files), "eval": split(eval_files)},
               {"from": "tfrecord", "input": path, "eval_input": options.eval_input},
               _fingerprint("tfrecord", train_files + eval_files,
                            {"features": spec, "label": options.label}))


def _json_option(value: str):
  text = value
  if value.startswith("@"):
    try:
      with open(value[1:], encoding="utf-8") as f:
        text = f.read()
    except OSError as e:
      raise DataError(f"--features={value}: cannot read ({e.strerror})") from None
  try:
    return json.loads(text)
  except ValueError as e:
    raise DataError(f"--features: not valid JSON ({e})") from None


def _files(patterns: str, flag: str) -> list[str]:
  files = []
  for pattern in patterns.split(","):
    matched = sorted(glob.glob(pattern.strip()))
    if not matched:
      raise DataError(f"{flag}={pattern}: no such file")
    files += [f for f in matched if os.path.isfile(f)]
  return files


def _compression(files: list[str]) -> str:
  return "GZIP" if all(f.endswith(".gz") for f in files) else ""


def _op_message(error) -> str:
  """A TensorFlow error's message without its node and op decorations."""
  text = re.sub(r"\{\{[^}]*\}\}|\[Op:\w+\]", "", getattr(error, "message", str(error)))
  return " ".join(text.split())[:200]


LOADS_TENSORFLOW = ("tfrecord",)  # a format whose check itself loads TensorFlow
FORMATS = {"idx": idx, "npz": npz, "csv": csv, "image_folder": image_folder,
           "tfrecord": tfrecord}
