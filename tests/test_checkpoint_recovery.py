"""Damaged checkpoints, divergence with rollback, retention and warm starts."""
import glob
import json
import os
import re
import shutil

import pytest

from tests.cli import run_trainer, train_ok

_FLAGS = ["--config=synthetic", "--config.train.steps_per_loop=10",
          "--config.checkpoint.interval=20", "--config.data.num_train_examples=2000"]


def _truncate_arrays(step_dir):
  for path in glob.glob(f"{step_dir}/model/**/d/*", recursive=True):
    with open(path, "r+b") as f:
      f.truncate(8)


def _delete_manifest(step_dir):
  os.remove(f"{step_dir}/model/manifest.ocdbt")


def _delete_item(step_dir):
  shutil.rmtree(f"{step_dir}/optimizer")


@pytest.mark.parametrize("damage", [_truncate_arrays, _delete_manifest, _delete_item],
                         ids=["truncated", "deleted-file", "deleted-item"])
def test_damaged_latest_checkpoint_falls_back_to_the_previous(tmp_path, damage):
  train_ok(tmp_path, *_FLAGS, "--config.train.steps=60")
  damage(tmp_path / "checkpoints" / "60")
  result = run_trainer(tmp_path, *_FLAGS, "--config.train.steps=80")
  assert result.returncode == 0, result.stderr
  assert "Traceback" not in result.stderr
  assert re.search(r"Checkpoint 60 is unreadable .*moved to .*checkpoints_corrupt/60\.",
                   result.stderr)
  assert "Restored checkpoint at step 40" in result.stderr
  assert len(os.listdir(tmp_path / "checkpoints_corrupt")) == 1  # kept, not deleted
  assert json.loads((tmp_path / "summary.json").read_text())["step"] == 80


def test_rollback_restores_and_skips_ahead_until_its_budget_is_spent(tmp_path):
  train_ok(tmp_path, *_FLAGS, "--config.train.steps=20")
  result = run_trainer(tmp_path, *_FLAGS, "--config.train.steps=100",
                       "--config.train.learning_rate=1e9", "--config.train.nonfinite_policy=rollback",
                       "--config.train.max_rollbacks=2")
  assert result.returncode == 1
  assert "Traceback" not in result.stderr
  skipped = [int(n) for n in re.findall(r"rolled back to step 20 and skipped the data up to "
                                        r"example (\d+)", result.stderr)]
  assert len(skipped) == 2 and skipped[0] < skipped[1]  # each retry starts on new data
  error = result.stderr.strip().splitlines()[-1]
  assert error.startswith("distloop: error: non-finite") and "after 2 rollback(s)" in error
  assert sorted(os.listdir(tmp_path / "checkpoints")) == ["20"]


def test_keep_period_keeps_old_steps_beside_the_newest(tmp_path):
  train_ok(tmp_path, *_FLAGS, "--config.train.steps=100", "--config.checkpoint.interval=10",
           "--config.checkpoint.max_to_keep=2", "--config.checkpoint.keep_period=30")
  assert sorted(int(s) for s in os.listdir(tmp_path / "checkpoints")) == [30, 60, 90, 100]


def test_keep_best_keeps_the_most_accurate_steps(tmp_path):
  result = run_trainer(tmp_path, *_FLAGS, "--mode=train_and_eval", "--config.train.steps=100",
                       "--config.eval.interval=20", "--config.checkpoint.keep_best=2",
                       "--config.checkpoint.max_to_keep=1")
  assert result.returncode == 0, result.stderr
  accuracy = {int(step): float(acc) for step, acc in
              re.findall(r"eval at step (\d+) \| loss [\d.]+ \| accuracy ([\d.]+)", result.stderr)}
  assert sorted(accuracy) == [20, 40, 60, 80, 100]
  kept = sorted(int(s) for s in os.listdir(tmp_path / "checkpoints_best"))
  best_two = sorted(accuracy, key=lambda s: (accuracy[s], s))[-2:]
  assert len(kept) == 2 and min(accuracy[s] for s in kept) >= min(accuracy[s] for s in best_two)
  assert sorted(os.listdir(tmp_path / "checkpoints")) == ["100"]


def test_warm_start_takes_weights_from_another_run(tmp_path):
  source = tmp_path / "source"
  train_ok(source, *_FLAGS, "--config.train.steps=200")
  warm = tmp_path / "warm"
  summary = train_ok(warm, *_FLAGS, "--config.train.steps=2", "--config.train.learning_rate=1e-6",
                     f"--config.checkpoint.init_from={source}")
  assert summary["eval_accuracy"] > 0.9  # 2 tiny steps from scratch would be near chance


def test_warm_start_from_another_model_is_refused(tmp_path):
  source = tmp_path / "source"
  train_ok(source, *_FLAGS, "--config.train.steps=20")
  target = tmp_path / "target"
  result = run_trainer(target, *_FLAGS, "--config.model.conv_filters=8",
                       f"--config.checkpoint.init_from={source}/checkpoints/20")
  assert result.returncode == 2
  assert len(result.error_lines()) == 1 and "mnist_cnn/conv/" in result.stderr
  assert not target.exists()
