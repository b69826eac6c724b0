"""Eval counts every test example exactly once, on any replica count, partial batch included."""
import json

import pytest

from tests.support.cli import run_trainer, train_ok

# 1,001 examples in batches of 100: ten full batches and one of a single example,
# which 3 replicas cannot split evenly (two of them get nothing).
_FLAGS = ["--config=synthetic", "--config.train.steps=60", "--config.train.global_batch_size=48",
          "--config.data.num_eval_examples=1001", "--config.eval.global_batch_size=100"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  model_dir = tmp_path_factory.mktemp("eval_exact")
  summary = train_ok(model_dir, *_FLAGS, "--config.runtime.strategy=mirrored",
                     "--config.runtime.num_cpu_devices=3")
  return model_dir, summary


def test_three_replicas_count_every_example_once(trained):
  _, summary = trained
  assert summary["num_replicas"] == 3
  assert summary["eval_examples"] == 1001


def test_one_replica_scores_the_same_checkpoint_identically(trained):
  model_dir, summary = trained
  result = run_trainer(model_dir, *_FLAGS, "--mode=eval")
  assert result.returncode == 0, result.stderr
  metrics = json.loads(result.stdout.strip().splitlines()[-1])
  assert metrics["examples"] == 1001
  assert metrics["accuracy"] == pytest.approx(summary["eval_accuracy"], abs=1e-12)
  assert metrics["loss"] == pytest.approx(summary["eval_loss"], rel=1e-5)
