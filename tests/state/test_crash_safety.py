"""SIGKILL at random moments, some during async saves: every restart resumes from the
latest complete checkpoint and the run ends with the uninterrupted run's weights."""
import os
import random
import re
import signal

import pytest

from tests.support.cli import run_trainer, train_ok
from tests.support.processes import TrainerProcess, assert_same_state, checkpoint_arrays

pytestmark = pytest.mark.slow  # python -m pytest -m slow (CI runs these too)

_FLAGS = ["--config=synthetic", "--config.train.steps=200", "--config.train.global_batch_size=48",
          "--config.train.steps_per_loop=5", "--config.checkpoint.interval=20",
          "--config.data.num_train_examples=1000", "--config.runtime.deterministic=true"]


def _kill_points(seed: int) -> list[str]:
  """Three moments, in order: the first lands right as an async save starts."""
  rng = random.Random(seed)
  save_step = rng.choice(range(20, 180, 20))
  step_a, step_b = rng.sample(range(25, 195, 5), 2)
  points = [(save_step, rf"checkpoint at step {save_step} started"),
            (step_a, rf"step {step_a}/200"), (step_b, rf"step {step_b}/200")]
  return [pattern for _, pattern in sorted(points)]


@pytest.mark.parametrize("seed", [7])
def test_sigkill_three_times_then_finish(tmp_path_factory, seed):
  reference = tmp_path_factory.mktemp("uninterrupted")
  train_ok(reference, *_FLAGS)
  expected = checkpoint_arrays(reference, 200)

  model_dir = tmp_path_factory.mktemp("killed")
  for pattern in _kill_points(seed):
    process = TrainerProcess(model_dir, *_FLAGS)
    try:
      process.wait_for(pattern)
      process.send(signal.SIGKILL)
      assert process.wait() == -signal.SIGKILL
    finally:
      process.kill()
    restored = re.findall(r"Restored checkpoint at step (\d+)", process.output)
    complete = [int(s) for s in os.listdir(model_dir / "checkpoints") if s.isdigit()]
    assert all(int(step) % 20 == 0 for step in restored)
    assert complete and all(step % 20 == 0 for step in complete)

  finished = run_trainer(model_dir, *_FLAGS)
  assert finished.returncode == 0, finished.stderr
  assert "Restored checkpoint at step" in finished.stderr
  assert_same_state(checkpoint_arrays(model_dir, 200), expected, atol=1e-6)
  # A save cut short leaves a temporary that is never restored and is cleaned up.
  assert not [name for name in os.listdir(model_dir / "checkpoints") if "tmp" in name]
