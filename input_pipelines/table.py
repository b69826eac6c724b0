"""Tables of numbers: binary classification (`tabular`) and regression (`regression`).

`data.dir` names the user's table; empty, the data is synthetic from the seed.

- a `.csv` file: a header row, then one row per example, every cell a finite
  number; the column `data.label_column` is the label, every other column a
  feature (in file order);
- a `.npz` file: arrays `features` [N, F] and `labels` [N] (or `x` and `y`);
- a folder holding `train.csv` (or `train.npz`) and, optionally, `test.csv`
  (or `test.npz`) with the same columns.

Without a test file the eval split is a held-out share `data.eval_fraction` of
the rows, drawn by a permutation from the seed (the same rows every run of the
seed). Features are float32 [N, F] as stored (no scaling: standardize your
columns yourself), labels float32 [N]; `tabular` labels must be 0 or 1.

Synthetic data (`data.dir` empty) follows a fixed hidden rule drawn from the
seed, so it is learnable, with `data.num_features` standard-normal features:
`tabular` labels are the sign of a random linear combination plus a mild
nonlinear term; `regression` targets are a smooth nonlinear function plus small
noise, with variance 1 (predicting the mean scores an MSE of about 1).

Builders here run numpy only (no TensorFlow), so a bad file is one line naming
it (`DataError`) before anything starts.
"""
import csv
import functools
import os
import warnings

import ml_collections
import numpy as np

from input_pipelines.errors import DataError

Split = tuple[np.ndarray, np.ndarray]

_NPZ_KEYS = (("features", "labels"), ("x", "y"))
_REGRESSION_NOISE = 0.1  # noise std of synthetic targets (of total std 1): an MSE floor of 0.01


def build_tabular(data_config: ml_collections.ConfigDict, seed: int) -> tuple[Split, Split]:
  """Binary classification: float32 features [N, F], float32 labels [N] in {0, 1}."""
  if not data_config.dir:
    return _synthetic(data_config, seed, _classification_rule)
  check = functools.partial(_check_binary, label_column=data_config.label_column)
  train, test = _load(data_config, seed, check)
  return train[1], test[1]


def build_regression(data_config: ml_collections.ConfigDict, seed: int) -> tuple[Split, Split]:
  """Regression: float32 features [N, F], float32 targets [N]."""
  if not data_config.dir:
    return _synthetic(data_config, seed, _regression_rule)
  train, test = _load(data_config, seed)
  return train[1], test[1]


# Synthetic data ----------------------------------------------------------------------------

def _synthetic(data_config, seed: int, make_rule) -> tuple[Split, Split]:
  """Train and eval examples of one hidden rule: the rule from [seed, 0], the splits from
  [seed, 1] and [seed, 2], so the eval split is the same whatever the training size."""
  source = f"data.name={data_config.name!r} (synthetic)"
  num_features = data_config.num_features
  for field in ("num_features", "num_train_examples", "num_eval_examples"):
    if data_config[field] < 1:
      raise DataError(f"{source}: data.{field}={data_config[field]} must be at least 1")
  rule = make_rule(np.random.default_rng([seed, 0]), num_features)
  splits = []
  for stream, n in ((1, data_config.num_train_examples), (2, data_config.num_eval_examples)):
    rng = np.random.default_rng([seed, stream])
    features = rng.standard_normal((n, num_features))
    splits.append((features.astype(np.float32), rule(features, rng).astype(np.float32)))
  return splits[0], splits[1]


def _directions(rng: np.random.Generator, num_features: int, count: int) -> np.ndarray:
  """[count, F]: random unit vectors, orthonormal while count <= F (else just unit)."""
  vectors = rng.standard_normal((num_features, count))
  if num_features >= count:
    return np.linalg.qr(vectors)[0].T
  return (vectors / np.linalg.norm(vectors, axis=0)).T


def _classification_rule(rng: np.random.Generator, num_features: int):
  """label = [z1 + 0.3 (z2^2 - 1) > 0], z1, z2 orthogonal standard-normal projections of x:
  a bent boundary (the best linear rule is right about 91% of the time, the rule 100%)."""
  w, u = _directions(rng, num_features, 2)

  def rule(features: np.ndarray, _) -> np.ndarray:
    score = features @ w + 0.3 * ((features @ u) ** 2 - 1.0)
    return (score > 0).astype(np.float32)
  return rule


def _regression_rule(rng: np.random.Generator, num_features: int):
  """target = (sin(1.5 z1) + 0.5 z2) / c + 0.1 noise, z1, z2 orthogonal (so independent)
  standard-normal projections of x, c such that the variance is 1 in expectation."""
  a, b = _directions(rng, num_features, 2)
  signal_variance = (1.0 - np.exp(-2 * 1.5 ** 2)) / 2 + 0.5 ** 2  # Var sin(1.5 z) + Var 0.5 z
  scale = np.sqrt(signal_variance / (1.0 - _REGRESSION_NOISE ** 2))

  def rule(features: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    signal = (np.sin(1.5 * (features @ a)) + 0.5 * (features @ b)) / scale
    return signal + _REGRESSION_NOISE * rng.standard_normal(len(features))
  return rule


# Files -------------------------------------------------------------------------------------

def _load(data_config, seed: int, check=None):
  """((train_path, (features, labels)), (eval_path, (features, labels))) from data.dir;
  `check(path, labels)` sees each file's labels before any hold-out."""
  path = data_config.dir
  if os.path.isdir(path):
    train_path = _pick(path, "train", required=True)
    test_path = _pick(path, "test", required=False)
  elif os.path.isfile(path):
    if not path.endswith((".csv", ".npz")):
      raise DataError(f"{path}: not a .csv or .npz file (data.dir takes a .csv or .npz file "
                      f"or a folder holding train.csv or train.npz)")
    train_path, test_path = path, None
  else:
    raise DataError(f"{path}: no such file or folder (data.dir)")

  columns, train = _read(train_path, data_config.label_column)
  if check:
    check(train_path, train[1])
  if test_path is None:
    return _hold_out(train_path, train, data_config.eval_fraction, seed)
  test_columns, test = _read(test_path, data_config.label_column)
  _check_same_columns(test_path, test_columns, os.path.basename(train_path), columns)
  if check:
    check(test_path, test[1])
  if isinstance(columns, list) and isinstance(test_columns, list):  # both CSV: train's order
    order = [test_columns.index(n) for n in columns]
    test = (np.ascontiguousarray(test[0][:, order]), test[1])
  return (train_path, train), (test_path, test)


def _pick(folder: str, stem: str, required: bool) -> str | None:
  found = [os.path.join(folder, stem + ext) for ext in (".csv", ".npz")
           if os.path.isfile(os.path.join(folder, stem + ext))]
  if len(found) > 1:
    raise DataError(f"{folder}: holds both {stem}.csv and {stem}.npz; keep one")
  if not found:
    if required:
      raise DataError(f"{folder}: holds no train.csv or train.npz (data.dir takes a .csv or "
                      f".npz file or a folder holding train.csv or train.npz)")
    return None
  return found[0]


def _read(path: str, label_column: str):
  """(feature column names, or the feature count of an npz, (features, labels)), checked."""
  if path.endswith(".npz"):
    features, labels = _read_npz(path)
    return features.shape[1], (features, labels)
  names, table = _read_csv(path)
  if label_column not in names:
    raise DataError(f"{path}: no column {label_column!r} (data.label_column); its columns "
                    f"are {', '.join(map(repr, names))}")
  feature_names = [n for n in names if n != label_column]
  if not feature_names:
    raise DataError(f"{path}: no feature columns, only the label column {label_column!r}")
  order = [names.index(n) for n in feature_names]
  return feature_names, (np.ascontiguousarray(table[:, order]),
                         table[:, names.index(label_column)].copy())


def _check_same_columns(path: str, columns, train_name: str, train_columns) -> None:
  """The test file has the training file's features: by name (CSV) or by count."""
  if isinstance(columns, list) and isinstance(train_columns, list):
    missing = [n for n in train_columns if n not in columns]
    if missing:
      raise DataError(f"{path}: no column {', '.join(map(repr, missing))}, which "
                      f"{train_name} has")
    extra = [n for n in columns if n not in train_columns]
    if extra:
      raise DataError(f"{path}: column {', '.join(map(repr, extra))} is not in {train_name}")
    return
  count = columns if isinstance(columns, int) else len(columns)
  train_count = train_columns if isinstance(train_columns, int) else len(train_columns)
  if count != train_count:
    raise DataError(f"{path}: {count} features per row, {train_name} {train_count}")


def _read_csv(path: str) -> tuple[list[str], np.ndarray]:
  """(column names, float32 [rows, columns]); DataError naming the line and column."""
  try:
    with open(path, newline="", encoding="utf-8-sig") as f:
      header = next(csv.reader(f), None)
  except (OSError, UnicodeDecodeError) as e:
    raise DataError(f"{path}: cannot read ({_reason(e)})") from None
  if header is None:
    raise DataError(f"{path}: the file is empty (expected a header row naming the columns)")
  names = [n.strip() for n in header]
  if any(not n for n in names):
    raise DataError(f"{path}: the header has an empty column name (column "
                    f"{[not n for n in names].index(True) + 1})")
  duplicate = next((n for i, n in enumerate(names) if n in names[:i]), None)
  if duplicate is not None:
    raise DataError(f"{path}: the header names column {duplicate!r} twice")
  try:  # the fast path: numpy's C parser; on any doubt, find the cell in Python
    with warnings.catch_warnings():
      warnings.simplefilter("ignore")  # "input contained no data": said below, as an error
      table = np.loadtxt(path, delimiter=",", skiprows=1, dtype=np.float64, ndmin=2,
                         comments=None, encoding="utf-8-sig")
  except ValueError:
    table = None
  if table is None or table.shape[1:] != (len(names),) or not np.isfinite(table).all():
    table = _read_csv_slowly(path, names)
  if table.shape[0] == 0:
    raise DataError(f"{path}: no rows after the header")
  return names, table.astype(np.float32)


def _read_csv_slowly(path: str, names: list[str]) -> np.ndarray:
  """The table cell by cell, to say exactly which line and column is wrong."""
  rows = []
  with open(path, newline="", encoding="utf-8-sig") as f:
    reader = csv.reader(f)
    next(reader)
    for row in reader:
      line = reader.line_num
      if not row or (len(row) == 1 and not row[0].strip()):
        continue  # blank line
      if len(row) != len(names):
        raise DataError(f"{path}: line {line} has {len(row)} cells, the header {len(names)}")
      values = []
      for name, cell in zip(names, row):
        try:
          value = float(cell)
        except ValueError:
          what = "is empty" if not cell.strip() else f"holds {cell.strip()[:40]!r}, not a number"
          raise DataError(f"{path}: line {line}, column {name!r} {what}") from None
        if not np.isfinite(value):
          raise DataError(f"{path}: line {line}, column {name!r} holds {cell.strip()!r}, not "
                          f"a finite number")
        values.append(value)
      rows.append(values)
  return np.array(rows, dtype=np.float64).reshape(len(rows), len(names))


def _read_npz(path: str) -> tuple[np.ndarray, np.ndarray]:
  try:
    with np.load(path, allow_pickle=False) as f:
      keys = set(f.files)
      pair = next((p for p in _NPZ_KEYS if set(p) <= keys), None)
      if pair is None:
        raise DataError(f"{path}: no arrays 'features' and 'labels' (or 'x' and 'y'); it "
                        f"holds {', '.join(sorted(keys)) or 'no arrays'}")
      features, labels = f[pair[0]], f[pair[1]]
  except DataError:
    raise
  except Exception as e:  # pylint: disable=broad-except  (zipfile, pickle and OS errors alike)
    raise DataError(f"{path}: cannot read as .npz ({_reason(e)})") from None
  for name, array in zip(pair, (features, labels)):
    if array.dtype.kind not in "biuf":
      raise DataError(f"{path}: {name!r} has dtype {array.dtype}; expected numbers")
  if features.ndim != 2:
    raise DataError(f"{path}: {pair[0]!r} has shape {features.shape}; expected "
                    f"[examples, features]")
  if labels.ndim == 2 and labels.shape[1] == 1:
    labels = labels[:, 0]
  if labels.ndim != 1:
    raise DataError(f"{path}: {pair[1]!r} has shape {labels.shape}; expected [examples]")
  if len(features) != len(labels):
    raise DataError(f"{path}: {len(features)} rows of {pair[0]!r} but {len(labels)} "
                    f"{pair[1]!r}")
  if len(labels) == 0:
    raise DataError(f"{path}: no examples")
  features, labels = features.astype(np.float32), labels.astype(np.float32)
  for name, array in zip(pair, (features, labels)):
    bad = np.argwhere(~np.isfinite(array))
    if len(bad):
      raise DataError(f"{path}: {name!r} holds a non-finite value at index "
                      f"{tuple(int(i) for i in bad[0])}")
  return features, labels


def _hold_out(path: str, table: Split, eval_fraction: float, seed: int):
  """A seeded share `eval_fraction` of the rows as the eval split, the rest to train."""
  features, labels = table
  n = len(labels)
  num_eval = min(max(int(round(n * eval_fraction)), 0), n)
  if not 0 < num_eval < n:
    raise DataError(f"{path}: data.eval_fraction={eval_fraction} of its {n} rows leaves "
                    f"an empty {'eval' if num_eval == 0 else 'train'} split (there is no "
                    f"test file; use a fraction in (0, 1) or add one)")
  order = np.random.default_rng([seed, 3]).permutation(n)
  eval_rows, train_rows = np.sort(order[:num_eval]), np.sort(order[num_eval:])
  return ((path, (features[train_rows], labels[train_rows])),
          (f"{path} (held-out rows)", (features[eval_rows], labels[eval_rows])))


def _check_binary(path: str, labels: np.ndarray, label_column: str) -> None:
  bad = np.flatnonzero((labels != 0) & (labels != 1))
  if len(bad):
    where = (f"column {label_column!r}, data row {bad[0] + 1}" if path.endswith(".csv")
             else f"labels[{bad[0]}]")
    raise DataError(f"{path}: {where} is {labels[bad[0]]:g}; data.name='tabular' takes "
                    f"labels 0 and 1 (use data.name='regression' for other targets)")


def _reason(e: Exception) -> str:
  return (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
