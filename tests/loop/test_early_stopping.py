"""checkpoint.early_stop_patience (built in) and model_dir/metrics.csv: the run stops at
the eval the rule names, with its checkpoint and export; the count of evals without a gain
survives a resume; metrics.csv holds every reported value once per step, even when a
crash makes steps run twice. (2 workers stopping together: tests/loop/test_actions.py.)"""
import csv
import collections
import os
import signal

import pytest

from tests.support.cli import run_trainer, train_ok
from tests.support.processes import TrainerProcess

_FLAGS = ["--config=synthetic", "--mode=train_and_eval", "--config.train.steps_per_loop=10",
          "--config.eval.interval=10", "--config.data.num_train_examples=512",
          "--config.data.num_eval_examples=200", "--config.checkpoint.best_metric=loss",
          "--config.checkpoint.best_mode=min"]
# An eval loss must fall by more than 10 to count: only the first eval sets a best, so the
# run stops exactly `patience` evals later.
_NO_GAIN_COUNTS = ["--config.checkpoint.early_stop_min_delta=10"]


def _rows(model_dir) -> list[dict]:
  with open(os.path.join(model_dir, "metrics.csv"), newline="") as f:
    return list(csv.DictReader(f))


def test_stops_at_the_eval_its_patience_names_with_checkpoint_and_export(tmp_path):
  """Catches: stopping one eval early or late (patience counted from 0 or 1), no final
  checkpoint or export, the decision not reported in summary.json."""
  summary = train_ok(tmp_path, *_FLAGS, *_NO_GAIN_COUNTS, "--config.train.steps=200",
                     "--config.checkpoint.early_stop_patience=3")
  assert summary["step"] == 40 and summary["stopped_early_by"] == "early_stop"
  assert "40" in os.listdir(tmp_path / "checkpoints")
  assert os.path.isdir(tmp_path / "export" / "40")
  evals = [int(row["step"]) for row in _rows(tmp_path)
           if row["split"] == "eval" and row["name"] == "loss"]
  assert evals == [10, 20, 30, 40]


@pytest.mark.slow
def test_an_improving_metric_does_not_stop_the_run(tmp_path):
  """The loss of the seed CNN on synthetic data falls at every eval of a short run: with
  no minimum gain the run goes to train.steps. Catches: improvement compared the wrong
  way round (best_mode), a stop on the first eval."""
  summary = train_ok(tmp_path, *_FLAGS, "--config.train.steps=40",
                     "--config.checkpoint.early_stop_patience=1")
  assert summary["step"] == 40 and "stopped_early_by" not in summary


@pytest.mark.slow
def test_the_count_survives_a_resume(tmp_path):
  """20 steps (evals 10: the best, 20: one without a gain), then a second process to 200 with
  patience 3: it stops at 40 (evals 30, 40 without a gain). Catches: the count kept in
  memory only (a resumed run would start over and stop at 60)."""
  flags = [*_FLAGS, *_NO_GAIN_COUNTS, "--config.checkpoint.early_stop_patience=3"]
  assert train_ok(tmp_path, *flags, "--config.train.steps=20")["step"] == 20
  summary = train_ok(tmp_path, *flags, "--config.train.steps=200")
  assert summary["step"] == 40 and summary["stopped_early_by"] == "early_stop"


def test_early_stopping_without_evals_during_training_is_refused(tmp_path):
  result = run_trainer(tmp_path / "run", "--config=synthetic",
                       "--config.checkpoint.early_stop_patience=2")
  assert result.returncode == 2
  (line,) = result.error_lines()
  assert "needs evals during training: --mode=train_and_eval" in line, line
  assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_metrics_csv_logs_each_step_once_across_a_crash(tmp_path):
  """SIGKILL after the step-30 boundary was logged but only step 20 was checkpointed: the
  resumed run trains 21..30 again and logs them once. Catches: appending blindly (step
  30's rows twice, the first from weights that no longer exist)."""
  flags = [*_FLAGS, "--config.train.steps=60", "--config.checkpoint.interval=20",
           "--config.checkpoint.async_save=false"]
  process = TrainerProcess(tmp_path, *flags)
  try:
    process.wait_for(r"step 30/60")
    process.send(signal.SIGKILL)
    process.wait()
  finally:
    process.kill()
  assert ("30", "train", "loss") in {(r["step"], r["split"], r["name"]) for r in _rows(tmp_path)}
  train_ok(tmp_path, *flags)
  rows = _rows(tmp_path)
  counts = collections.Counter((r["step"], r["split"], r["name"]) for r in rows)
  assert max(counts.values()) == 1, [key for key, n in counts.items() if n > 1]
  steps = sorted({int(r["step"]) for r in rows if r["split"] == "train"})
  assert steps == [10, 20, 30, 40, 50, 60]
  names = {r["name"] for r in rows if r["split"] == "train"}
  assert {"loss", "accuracy", "learning_rate"} <= names, names
  assert "gradient_norm" not in names, names  # train.report_gradient_norm is off by default
  assert {r["name"] for r in rows if r["split"] == "eval"} == {"loss", "accuracy", "examples"}
