"""SIGTERM/SIGINT/SIGHUP: exit 42 with a checkpoint at the current step; the same command resumes
and ends with the weights of an uninterrupted run (deterministic kernels, <= 1e-6)."""
import os
import re
import signal

import pytest

from tests.support.cli import run_trainer, train_ok
from tests.support.processes import TrainerProcess, assert_same_state, checkpoint_arrays

pytestmark = pytest.mark.slow  # python -m pytest -m slow (CI runs these too)

# 1,000 examples at batch 48: an epoch is 20.8 steps, so step 35 is mid-epoch and
# batches straddle epoch boundaries.
_FLAGS = ["--config=synthetic", "--config.train.steps=120", "--config.train.global_batch_size=48",
          "--config.train.steps_per_loop=5", "--config.checkpoint.interval=50",
          "--config.data.num_train_examples=1000", "--config.runtime.deterministic=true",
          "--config.runtime.strategy=mirrored"]

# A single SIGTERM on 1 and 2 replicas, bit for bit: the guarantee matrix's sigterm cells
# (tests/guarantees, the seed CNN among its workloads).
_CASES = {  # (model, replicas, signals sent)
    "sigterm-twice-2-replicas": ("mnist_cnn", 2, [signal.SIGTERM, signal.SIGTERM]),
    "sigint-dropout-rng-state": ("mlp", 1, [signal.SIGINT]),
    # A closed terminal or a dropped ssh session: a preemption too (it was a death, 129).
    "sighup-1-replica": ("mnist_cnn", 1, [signal.SIGHUP]),
}


def _flags(model, replicas):
  return [*_FLAGS, f"--config.model.name={model}", f"--config.runtime.num_cpu_devices={replicas}"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
  """Final state of an uninterrupted run, per (model, replicas), computed once."""
  cache = {}

  def get(model, replicas):
    if (model, replicas) not in cache:
      model_dir = tmp_path_factory.mktemp(f"uninterrupted_{model}_{replicas}")
      train_ok(model_dir, *_flags(model, replicas))
      cache[model, replicas] = checkpoint_arrays(model_dir, 120)
    return cache[model, replicas]
  return get


@pytest.mark.parametrize("case", sorted(_CASES))
def test_stop_then_resume_matches_uninterrupted(tmp_path, uninterrupted, case):
  model, replicas, signals = _CASES[case]
  flags = _flags(model, replicas)
  process = TrainerProcess(tmp_path, *flags)
  try:
    process.wait_for(r"step 35/120")
    for signum in signals:
      process.send(signum)
    assert process.wait() == 42, process.output
  finally:
    process.kill()
  stopped_at = int(re.search(r"preempted at step (\d+)", process.output).group(1))
  assert 35 <= stopped_at < 120 and stopped_at % 50  # the current step, not a periodic one
  assert str(stopped_at) in os.listdir(tmp_path / "checkpoints")
  assert not (tmp_path / "summary.json").exists()

  resumed = run_trainer(tmp_path, *flags)
  assert resumed.returncode == 0, resumed.stderr
  assert f"Restored checkpoint at step {stopped_at}" in resumed.stderr
  assert_same_state(checkpoint_arrays(tmp_path, 120), uninterrupted(model, replicas), atol=1e-6)


def test_resume_may_change_learning_rate_and_steps(tmp_path):
  flags = _flags("mnist_cnn", 1)
  train_ok(tmp_path, *flags, "--config.train.steps=50")
  summary = train_ok(tmp_path, *flags, "--config.train.steps=70",
                     "--config.train.learning_rate=0.0005")
  assert summary["step"] == 70
