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
import functools
import os

import ml_collections
import numpy as np

from input_pipelines.datasets import csv_rows
from input_pipelines.datasets import option_names
from input_pipelines.errors import DataError

Split = tuple[np.ndarray, np.ndarray]

_NPZ_KEYS = (("features", "labels"), ("x", "y"))
_REGRESSION_NOISE = 0.1  # noise std of synthetic targets (of total std 1): an MSE floor of 0.01


def build_tabular(data_config: ml_collections.ConfigDict, seed: int) -> tuple[Split, Split]:
  """Binary classification: float32 features [N, F], float32 labels [N] in {0, 1}."""
  if not data_config.dir:
    return _synthetic(data_config, seed, _classification_rule)
  check = functools.partial(_check_binary, label_column=data_config.label_column)
  train, test = load_files(data_config, seed, check)
  return train[1], test[1]


def build_regression(data_config: ml_collections.ConfigDict, seed: int) -> tuple[Split, Split]:
  """Regression: float32 features [N, F], float32 targets [N]."""
  if not data_config.dir:
    return _synthetic(data_config, seed, _regression_rule)
  train, test = load_files(data_config, seed)
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

def load_files(data_config, seed: int, check=None, names=option_names.CONFIG):
  """((train_path, (features, labels)), (eval_path, (features, labels))) from data.dir;
  `check(path, labels)` sees each file's labels before any hold-out; messages name the
  options as `names` spells them."""
  train_path, test_path = files(data_config.dir, names)
  columns, train = _read(train_path, data_config.label_column, names)
  if check:
    check(train_path, train[1])
  if test_path is None:
    return _hold_out(train_path, train, data_config.eval_fraction, seed, names)
  test_columns, test = _read(test_path, data_config.label_column, names)
  check_same_columns(test_path, test_columns, os.path.basename(train_path), columns)
  if check:
    check(test_path, test[1])
  if isinstance(columns, list) and isinstance(test_columns, list):  # both CSV: train's order
    order = [test_columns.index(n) for n in columns]
    test = (np.ascontiguousarray(test[0][:, order]), test[1])
  return (train_path, train), (test_path, test)


def files(path: str, names=option_names.CONFIG) -> tuple[str, str | None]:
  """(the training file, the test file or None) that `path` names."""
  what = (f"{names['dir']} takes a .csv or .npz file or a folder holding train.csv or "
          f"train.npz")
  if os.path.isdir(path):
    return _pick(path, "train", True, what), _pick(path, "test", False, what)
  if os.path.isfile(path):
    if not path.endswith((".csv", ".npz")):
      raise DataError(f"{path}: not a .csv or .npz file ({what})")
    return path, None
  raise DataError(f"{path}: no such file or folder ({names['dir']})")


def _pick(folder: str, stem: str, required: bool, what: str) -> str | None:
  found = [os.path.join(folder, stem + ext) for ext in (".csv", ".npz")
           if os.path.isfile(os.path.join(folder, stem + ext))]
  if len(found) > 1:
    raise DataError(f"{folder}: holds both {stem}.csv and {stem}.npz; keep one")
  if not found:
    if required:
      raise DataError(f"{folder}: holds no train.csv or train.npz ({what})")
    return None
  return found[0]


def _read(path: str, label_column: str, names=option_names.CONFIG):
  """(feature column names, or the feature count of an npz, (features, labels)), checked."""
  if path.endswith(".npz"):
    features, labels = _read_npz(path)
    return features.shape[1], (features, labels)
  columns = csv_rows.read_header(path)
  feature_names = feature_columns(path, columns, label_column, names)
  table = np.concatenate([np.empty((0, len(columns)), np.float32),
                          *csv_rows.chunks(path, columns)])
  if table.shape[0] == 0:
    raise DataError(f"{path}: no rows after the header")
  order = [columns.index(n) for n in feature_names]
  return feature_names, (np.ascontiguousarray(table[:, order]),
                         table[:, columns.index(label_column)].copy())


def feature_columns(path: str, columns: list[str], label_column: str,
                    names=option_names.CONFIG) -> list[str]:
  """The columns other than the label, in file order; DataError without the label."""
  if label_column not in columns:
    raise DataError(f"{path}: no column {label_column!r} ({names['label_column']}); its "
                    f"columns are {', '.join(map(repr, columns))}")
  feature_names = [n for n in columns if n != label_column]
  if not feature_names:
    raise DataError(f"{path}: no feature columns, only the label column {label_column!r}")
  return feature_names


def check_same_columns(path: str, columns, train_name: str, train_columns) -> None:
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
    raise DataError(f"{path}: cannot read as .npz ({csv_rows.reason(e)})") from None
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


def _hold_out(path: str, table: Split, eval_fraction: float, seed: int,
              names=option_names.CONFIG):
  """A seeded share `eval_fraction` of the rows as the eval split, the rest to train."""
  features, labels = table
  held_out = held_out_rows(path, len(labels), eval_fraction, seed, names)
  eval_rows, train_rows = np.flatnonzero(held_out), np.flatnonzero(~held_out)
  return ((path, (features[train_rows], labels[train_rows])),
          (f"{path} (held-out rows)", (features[eval_rows], labels[eval_rows])))


def held_out_rows(path: str, n: int, eval_fraction: float, seed: int,
                  names=option_names.CONFIG) -> np.ndarray:
  """Boolean mask [n]: the rows of the eval split (a seeded share `eval_fraction`)."""
  num_eval = min(max(int(round(n * eval_fraction)), 0), n)
  if not 0 < num_eval < n:
    raise DataError(f"{path}: {names['eval_fraction']}={eval_fraction} of its {n} rows "
                    f"leaves an empty {'eval' if num_eval == 0 else 'train'} split (there is "
                    f"no test file; use a fraction in (0, 1) or add one)")
  mask = np.zeros(n, dtype=bool)
  mask[np.random.default_rng([seed, 3]).permutation(n)[:num_eval]] = True
  return mask


def _check_binary(path: str, labels: np.ndarray, label_column: str) -> None:
  bad = np.flatnonzero((labels != 0) & (labels != 1))
  if len(bad):
    where = (f"column {label_column!r}, data row {bad[0] + 1}" if path.endswith(".csv")
             else f"labels[{bad[0]}]")
    raise DataError(f"{path}: {where} is {labels[bad[0]]:g}; data.name='tabular' takes "
                    f"labels 0 and 1 (use data.name='regression' for other targets)")
