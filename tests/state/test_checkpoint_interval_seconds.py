"""checkpoint.interval_seconds: a save at the first loop boundary after that much wall
time since the last save (two workers: tests/cluster/test_multi_worker.py). Time is passed in:
a fake clock for the rule, an interval every loop exceeds for the CLI."""
import os
import re

import pytest

from tests.support.cli import run_trainer
from trainer.loop import periodic


class _Clock:

  def __init__(self):
    self.now = 1000.0

  def __call__(self):
    return self.now


def test_due_once_the_interval_has_passed_since_the_last_save():
  clock = _Clock()
  timer = periodic.AfterSeconds(600, clock)
  clock.now += 599.9
  assert not timer.due()
  clock.now += 0.1
  assert timer.due() and timer.due()  # asking does not reset it; a save does
  timer.restart()
  assert not timer.due()
  clock.now += 600
  assert timer.due()


def test_zero_is_off():
  clock = _Clock()
  timer = periodic.AfterSeconds(0, clock)
  clock.now += 1e9
  assert not timer.due()


@pytest.mark.slow  # a whole training run or two: the fast suite's time (CI runs it)
def test_saves_at_the_first_boundary_after_the_interval(tmp_path):
  """Every loop takes longer than 1 ns: a save at every boundary, none by steps before
  the end (checkpoint.interval=100), the final step once."""
  result = run_trainer(tmp_path, "--config=synthetic", "--config.train.steps=30",
                       "--config.train.steps_per_loop=10", "--config.checkpoint.interval=100",
                       "--config.checkpoint.max_to_keep=10",
                       "--config.checkpoint.interval_seconds=1e-9")
  assert result.returncode == 0, result.stderr[-3000:]
  by_clock = re.findall(r"checkpoint.interval_seconds passed on the chief's clock: saving step "
                        r"(\d+)", result.stderr)
  assert by_clock == ["10", "20"]
  assert len(re.findall(r"checkpoint at step 30 started", result.stderr)) == 1
  assert sorted(int(step) for step in os.listdir(tmp_path / "checkpoints")) == [10, 20, 30]
