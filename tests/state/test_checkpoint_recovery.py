"""Damaged checkpoints, divergence with rollback, retention and warm starts."""
import glob
import json
import os
import re
import shutil

import numpy as np
import pytest

from tests.support.cli import run_trainer, train_ok

pytestmark = pytest.mark.slow  # python -m pytest -m slow (CI runs these too)

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


def test_a_non_finite_optimizer_slot_rolls_back_too(tmp_path):
  """tests/plugins/faults.py's loss: Adam's second moment overflows to Inf while the loss and the
  weights stay finite; under `rollback` that is a rollback, never an error at the save."""
  loss = "--config.train.loss=tests.plugins.faults:exploding_gradient_loss"
  train_ok(tmp_path, *_FLAGS, loss, "--config.train.steps=20")
  result = run_trainer(tmp_path, *_FLAGS, loss, "--config.train.steps=40",
                       "--config.train.steps_per_loop=1", "--config.checkpoint.interval=1",
                       "--config.train.nonfinite_policy=rollback", "--config.train.max_rollbacks=1",
                       env={"EXPLODE_GRADIENTS": "1"})
  assert result.returncode == 1
  assert "Traceback" not in result.stderr
  assert re.search(r"non-finite values in optimizer/adam/\S+_velocity in step 21: rolled back "
                   r"to step 20", result.stderr), result.stderr[-3000:]
  error = result.stderr.strip().splitlines()[-1]
  assert error.startswith("distloop: error: non-finite values in optimizer/") and \
      "after 1 rollback(s)" in error
  assert sorted(os.listdir(tmp_path / "checkpoints")) == ["20"]


def test_a_step_evaluated_again_after_a_rollback_keeps_its_best_checkpoint(tmp_path):
  """A NaN example in step 27 (tests/plugins/faults.py): steps 26..30 roll back to 20 and step 25
  is evaluated a second time; checkpoints_best/25 stays, the run goes on."""
  result = run_trainer(tmp_path, *_FLAGS, "--mode=train_and_eval", "--config.train.steps=40",
                       "--config.train.global_batch_size=48", "--config.train.steps_per_loop=5",
                       "--config.eval.interval=5", "--config.checkpoint.keep_best=10",
                       "--config.train.nonfinite_policy=rollback",
                       "--config.data.preprocess=tests.plugins.faults:nan_example")
  assert result.returncode == 0, result.stderr[-3000:]
  assert "rolled back to step 20" in result.stderr
  evaluated = re.findall(r"eval at step (\d+) ", result.stderr)
  assert evaluated.count("25") == 2
  assert re.search(r"step 25 is in \S+checkpoints_best already: kept as it is", result.stderr)
  kept = sorted(int(step) for step in os.listdir(tmp_path / "checkpoints_best"))
  assert kept == sorted({int(step) for step in evaluated})


def test_keep_best_ranks_by_metric_not_by_age(tmp_path):
  """After a rollback a step older than the newest kept one must still compete, and a
  step kept already is not written again (orbax: StepAlreadyExistsError)."""
  from trainer.state import checkpoints  # pylint: disable=g-import-not-at-top  (orbax, no TensorFlow)
  best = checkpoints.Checkpoints(str(tmp_path / "best"), max_to_keep=2, async_save=False,
                                 writer=True, best_metric="accuracy")
  tree = {"w": np.zeros(2, np.float32)}
  for step, accuracy in [(10, 0.5), (20, 0.7), (30, 0.6), (25, 0.9), (20, 0.1)]:
    best.save(step, tree, tree, {"step": step}, metrics={"accuracy": accuracy})
  best.wait()
  assert best.all_steps() == [20, 25]
  best.close()


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
