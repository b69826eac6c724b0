"""Tables: the `tabular` and `regression` builders (synthetic, CSV, npz, folders) and the CLI."""
import csv
import os

import numpy as np
import pytest

from configs import regression as regression_config
from configs import tabular as tabular_config
from input_pipelines.datasets import table
from input_pipelines.errors import DataError
from tests.support.cli import run_trainer, train_ok


def _data_config(name="tabular", **fields):
  config = (tabular_config if name == "tabular" else regression_config).get_config()
  data = config.data
  for key, value in fields.items():
    data[key] = value
  return data


def _build(data_config, seed=0):
  builder = table.build_tabular if data_config.name == "tabular" else table.build_regression
  return builder(data_config, seed)


def _write_csv(path, header, rows):
  with open(path, "w", newline="") as f:
    writer = csv.writer(f)
    writer.writerow(header)
    writer.writerows(rows)
  return str(path)


def _small_table(n=50, seed=0):
  """[n, 4]: columns a, b, label (0/1), c."""
  rng = np.random.default_rng(seed)
  rows = rng.normal(size=(n, 4)).round(3)
  rows[:, 2] = (rows[:, 0] > 0).astype(float)
  return ["a", "b", "label", "c"], rows


# Synthetic data ----------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["tabular", "regression"])
def test_synthetic_is_a_function_of_the_seed(name):
  config = _data_config(name, num_train_examples=500, num_eval_examples=100)
  (a_x, a_y), (a_ex, a_ey) = _build(config, seed=3)
  (b_x, b_y), (b_ex, b_ey) = _build(config, seed=3)
  (c_x, c_y), _ = _build(config, seed=4)
  for a, b in ((a_x, b_x), (a_y, b_y), (a_ex, b_ex), (a_ey, b_ey)):
    np.testing.assert_array_equal(a, b)
  assert not np.array_equal(a_x, c_x) and not np.array_equal(a_y, c_y)


@pytest.mark.parametrize("name", ["tabular", "regression"])
def test_synthetic_shapes_and_dtypes(name):
  config = _data_config(name, num_features=7, num_train_examples=300, num_eval_examples=40)
  (x, y), (ex, ey) = _build(config)
  assert x.shape == (300, 7) and ex.shape == (40, 7)
  assert y.shape == (300,) and ey.shape == (40,)
  assert {a.dtype for a in (x, y, ex, ey)} == {np.dtype(np.float32)}


def test_tabular_labels_are_balanced_bits_that_a_line_does_not_separate():
  (x, y), _ = _build(_data_config())
  assert set(np.unique(y)) == {0.0, 1.0}
  assert 0.4 < y.mean() < 0.6
  # The best least-squares linear rule is imperfect: the boundary is bent.
  design = np.c_[x, np.ones(len(x))]
  w = np.linalg.lstsq(design, 2 * y - 1, rcond=None)[0]
  assert 0.8 < ((design @ w > 0) == y).mean() < 0.95


def test_regression_targets_have_unit_variance_and_a_nonlinear_part():
  (x, y), (ex, ey) = _build(_data_config("regression"))
  assert 0.9 < y.var() < 1.1 and abs(y.mean()) < 0.1
  design, eval_design = np.c_[x, np.ones(len(x))], np.c_[ex, np.ones(len(ex))]
  w = np.linalg.lstsq(design, y, rcond=None)[0]
  linear_mse = np.mean((eval_design @ w - ey) ** 2)
  assert 0.1 < linear_mse < 0.9  # a line explains part, not all


# Files -------------------------------------------------------------------------------------

def test_csv_label_column_anywhere_features_in_file_order_and_a_seeded_hold_out(tmp_path):
  header, rows = _small_table(50)
  path = _write_csv(tmp_path / "t.csv", header, rows)
  (x, y), (ex, ey) = _build(_data_config(dir=path), seed=1)
  assert x.shape == (40, 3) and ex.shape == (10, 3)  # eval_fraction 0.2
  assert x.dtype == np.float32 and y.dtype == np.float32
  # Every row lands in exactly one split, with its label.
  got = np.r_[np.c_[x, y], np.c_[ex, ey]]
  want = rows[:, [0, 1, 3, 2]].astype(np.float32)
  np.testing.assert_array_equal(got[np.lexsort(got.T)], want[np.lexsort(want.T)])
  # The same seed holds out the same rows; another seed others.
  np.testing.assert_array_equal(_build(_data_config(dir=path), seed=1)[1][0], ex)
  assert not np.array_equal(_build(_data_config(dir=path), seed=2)[1][0], ex)


def test_label_column_is_configurable_and_regression_keeps_any_value(tmp_path):
  path = _write_csv(tmp_path / "prices.csv", ["rooms", "price"],
                    [[1, 10.5], [2, 20.25], [3, 30.0], [4, -41.0], [5, 50.0]])
  (x, y), (ex, ey) = _build(_data_config("regression", dir=path, label_column="price"))
  assert x.shape == (4, 1) and ex.shape == (1, 1)
  assert sorted(np.r_[y, ey].tolist()) == [-41.0, 10.5, 20.25, 30.0, 50.0]


@pytest.mark.parametrize("keys", [("features", "labels"), ("x", "y")])
def test_npz_file(tmp_path, keys):
  rng = np.random.default_rng(0)
  features, labels = rng.normal(size=(20, 3)), rng.integers(0, 2, size=20)
  path = str(tmp_path / "t.npz")
  np.savez(path, **{keys[0]: features, keys[1]: labels})
  (x, y), (ex, ey) = _build(_data_config(dir=path))
  assert x.shape == (16, 3) and ex.shape == (4, 3) and y.dtype == np.float32
  np.testing.assert_allclose(np.sort(np.r_[x, ex], axis=0),
                             np.sort(features.astype(np.float32), axis=0))


def test_folder_with_train_and_test_csv_uses_the_test_file_in_the_train_column_order(tmp_path):
  header, rows = _small_table(30)
  _write_csv(tmp_path / "train.csv", header, rows)
  _write_csv(tmp_path / "test.csv", ["c", "label", "b", "a"], rows[:5][:, [3, 2, 1, 0]])
  (x, y), (ex, ey) = _build(_data_config(dir=str(tmp_path)))
  assert len(x) == 30  # no hold-out when there is a test file
  np.testing.assert_array_equal(ex, rows[:5][:, [0, 1, 3]].astype(np.float32))
  np.testing.assert_array_equal(ey, rows[:5, 2].astype(np.float32))


def test_folder_with_train_and_test_npz(tmp_path):
  rng = np.random.default_rng(0)
  np.savez(tmp_path / "train.npz", features=rng.normal(size=(12, 2)), labels=np.ones(12))
  np.savez(tmp_path / "test.npz", x=rng.normal(size=(3, 2)), y=np.zeros(3))
  (x, y), (ex, ey) = _build(_data_config(dir=str(tmp_path)))
  assert x.shape == (12, 2) and ex.shape == (3, 2) and ey.tolist() == [0, 0, 0]


def test_folder_may_mix_a_train_csv_with_a_test_npz(tmp_path):
  header, rows = _small_table(10)
  _write_csv(tmp_path / "train.csv", header, rows)
  np.savez(tmp_path / "test.npz", x=np.zeros((2, 3)), y=np.ones(2))
  (x, _), (ex, ey) = _build(_data_config(dir=str(tmp_path)))
  assert x.shape == (10, 3) and ex.shape == (2, 3) and ey.tolist() == [1, 1]
  np.savez(tmp_path / "test.npz", x=np.zeros((2, 4)), y=np.ones(2))
  with pytest.raises(DataError, match="test.npz: 4 features per row, train.csv 3"):
    _build(_data_config(dir=str(tmp_path)))


def test_folder_with_only_train_csv_holds_out_a_share(tmp_path):
  header, rows = _small_table(20)
  _write_csv(tmp_path / "train.csv", header, rows)
  (x, _), (ex, _) = _build(_data_config(dir=str(tmp_path), eval_fraction=0.25))
  assert len(x) == 15 and len(ex) == 5


# Bad files: one line naming the file --------------------------------------------------------

def _bad(tmp_path, case):
  """(data.dir, the file the message must name, a word the message must hold, config fields)."""
  header, rows = _small_table(10)
  csv_path = str(tmp_path / "t.csv")
  if case == "missing file":
    return str(tmp_path / "nope.csv"), str(tmp_path / "nope.csv"), "no such file", {}
  if case == "missing label column":
    path = _write_csv(csv_path, ["a", "b", "target"], rows[:, :3])
    return path, path, "'a', 'b', 'target'", {}
  if case == "non-numeric cell":
    text = [list(map(str, r)) for r in rows]
    text[3][1] = "twelve"
    path = _write_csv(csv_path, header, text)
    return path, path, "line 5, column 'b' holds 'twelve', not a number", {}
  if case == "empty cell":
    text = [list(map(str, r)) for r in rows]
    text[0][3] = ""
    path = _write_csv(csv_path, header, text)
    return path, path, "line 2, column 'c' is empty", {}
  if case == "nan cell":
    text = [list(map(str, r)) for r in rows]
    text[1][0] = "nan"
    path = _write_csv(csv_path, header, text)
    return path, path, "line 3, column 'a' holds 'nan', not a finite number", {}
  if case == "empty file":
    open(csv_path, "w").close()
    return csv_path, csv_path, "empty", {}
  if case == "header only":
    path = _write_csv(csv_path, header, [])
    return path, path, "no rows", {}
  if case == "ragged row":
    text = [list(map(str, r)) for r in rows]
    text[6] = text[6][:3]
    path = _write_csv(csv_path, header, text)
    return path, path, "line 8 has 3 cells, the header 4", {}
  if case == "eval_fraction leaves an empty split":
    path = _write_csv(csv_path, header, rows[:2])
    return path, path, "empty eval split", {}
  if case == "eval_fraction leaves no training rows":
    path = _write_csv(csv_path, header, rows)
    return path, path, "empty train split", {"eval_fraction": 1.0}
  if case == "label not 0 or 1":
    rows = rows.copy()
    rows[4, 2] = 2
    path = _write_csv(csv_path, header, rows)
    return path, path, "column 'label', data row 5 is 2", {}
  if case == "folder without train file":
    _write_csv(tmp_path / "test.csv", header, rows)
    return str(tmp_path), str(tmp_path), "train.csv", {}
  if case == "test file without a training column":
    _write_csv(tmp_path / "train.csv", header, rows)
    test = _write_csv(tmp_path / "test.csv", ["a", "label", "c"], rows[:, [0, 2, 3]])
    return str(tmp_path), test, "'b'", {}
  if case == "npz without features":
    path = str(tmp_path / "t.npz")
    np.savez(path, inputs=rows, labels=rows[:, 2])
    return path, path, "inputs", {}
  if case == "npz length mismatch":
    path = str(tmp_path / "t.npz")
    np.savez(path, features=rows, labels=rows[:5, 2])
    return path, path, "10 rows", {}
  if case == "corrupt npz":
    path = str(tmp_path / "t.npz")
    with open(path, "wb") as f:
      f.write(b"PK\x03\x04 not really a zip")
    return path, path, "cannot read", {}
  if case == "other extension":
    path = str(tmp_path / "t.parquet")
    open(path, "w").write("x")
    return path, path, ".csv or .npz", {}
  raise AssertionError(case)


BAD_CASES = ["missing file", "missing label column", "non-numeric cell", "empty cell",
             "nan cell", "empty file", "header only", "ragged row",
             "eval_fraction leaves an empty split", "eval_fraction leaves no training rows",
             "label not 0 or 1", "folder without train file",
             "test file without a training column", "npz without features",
             "npz length mismatch", "corrupt npz", "other extension"]


@pytest.mark.parametrize("case", BAD_CASES)
def test_bad_file_is_one_line_naming_it(tmp_path, case):
  data_dir, named, expected, fields = _bad(tmp_path, case)
  with pytest.raises(DataError) as raised:
    _build(_data_config(dir=data_dir, **fields))
  message = str(raised.value)
  assert message.startswith(f"{named}: "), message
  assert expected in message, message
  assert "\n" not in message


# End to end, through the CLI ---------------------------------------------------------------

def test_tabular_config_learns_the_synthetic_rule(tmp_path):
  summary = train_ok(tmp_path / "run", "--config=tabular")
  assert summary["step"] == tabular_config.get_config().train.steps
  assert summary["eval_binary_accuracy"] >= 0.95, summary


def test_regression_config_beats_the_mean_by_5x(tmp_path):
  (_, train_labels), (_, eval_labels) = _build(_data_config("regression"), seed=0)
  mean_mse = float(np.mean((eval_labels - train_labels.mean()) ** 2))
  summary = train_ok(tmp_path / "run", "--config=regression")
  assert summary["eval_mean_squared_error"] * 5 <= mean_mse, (summary, mean_mse)
  assert summary["eval_mean_absolute_error"] < np.mean(np.abs(eval_labels - train_labels.mean()))


def test_a_users_csv_trains_through_the_cli(tmp_path):
  (x, y), _ = _build(_data_config(num_train_examples=2000, num_features=4), seed=5)
  header = ["f0", "f1", "label", "f2", "f3"]
  rows = np.c_[x[:, :2], y, x[:, 2:]]
  path = _write_csv(tmp_path / "users.csv", header, [[f"{v:.6g}" for v in r] for r in rows])
  summary = train_ok(tmp_path / "run", "--config=tabular", f"--config.data.dir={path}",
                     "--config.train.steps=300")
  assert summary["eval_examples"] == 400  # the held-out 20%
  assert summary["eval_binary_accuracy"] >= 0.9, summary


def test_a_csv_without_the_label_column_exits_2_with_one_line(tmp_path):
  path = _write_csv(tmp_path / "nolabel.csv", ["a", "b"], [[1, 2], [3, 4]])
  model_dir = tmp_path / "run"
  result = run_trainer(model_dir, "--config=tabular", f"--config.data.dir={path}", timeout=120)
  assert result.returncode == 2, result.stderr
  lines = result.error_lines()
  assert len(lines) == 1, result.stderr
  assert lines[0].startswith("distloop: error:") and path in lines[0] and "'label'" in lines[0]
  assert "Traceback" not in result.stderr
  assert not model_dir.exists()


@pytest.mark.slow  # a whole training run or two: the fast suite's time (CI runs it)
def test_keep_best_keeps_the_lowest_eval_mse_when_best_mode_is_min(tmp_path):
  from tensorboard.backend.event_processing import event_accumulator  # pylint: disable=import-outside-toplevel
  from tensorboard.util import tensor_util  # pylint: disable=import-outside-toplevel
  model_dir = tmp_path / "run"
  train_ok(model_dir, "--config=regression", "--mode=train_and_eval", "--config.train.steps=600",
           "--config.eval.interval=100", "--config.checkpoint.interval=100",
           "--config.checkpoint.keep_best=2")
  accumulator = event_accumulator.EventAccumulator(
      str(model_dir / "tensorboard" / "eval"), size_guidance={event_accumulator.TENSORS: 0})
  accumulator.Reload()
  mse = {e.step: float(tensor_util.make_ndarray(e.tensor_proto))
         for e in accumulator.Tensors("mean_squared_error")}
  assert sorted(mse) == [100, 200, 300, 400, 500, 600]
  best_two = sorted(sorted(mse, key=mse.get)[:2])
  kept = sorted(int(name) for name in os.listdir(model_dir / "checkpoints_best") if name.isdigit())
  assert kept == best_two, mse
  assert mse[100] > max(mse[step] for step in kept)  # the first eval is not among the best
