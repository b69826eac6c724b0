"""A run stopped by SIGTERM and resumed logs each loop's train values exactly once, in
metrics.csv and in TensorBoard, wherever the signal lands: in a loop, during a checkpoint
being written, while a boundary's actions run. The loop behind the stop trained and its step
is the one the run resumes from: a row it does not log before it exits 42 is never logged
(the resumed run logs from the next loop on), and a row logged twice is a step counted twice.
"""
import collections
import csv
import glob
import os
import re

import pytest

from tests.support.cli import run_trainer
from tests.support.processes import TrainerProcess

pytestmark = pytest.mark.slow  # four trainer processes

_STEPS, _LOOP = 60, 5
_FLAGS = ["--config=synthetic", f"--config.train.steps={_STEPS}",
          f"--config.train.steps_per_loop={_LOOP}", "--config.checkpoint.interval=10",
          "--config.train.global_batch_size=16", "--config.data.num_train_examples=256",
          "--config.data.num_eval_examples=32"]
_AT_FIRST_BOUNDARY = "--config.train.actions=tests/plugins/signal_actions.py:sigterm_at_first_boundary"


def _stopped(model_dir, pattern: str, *flags: str) -> int:
  """Runs (or resumes) until a line matches `pattern`, sends SIGTERM (none with a flag
  that signals from inside); returns the step the run says it saved (exit 42)."""
  process = TrainerProcess(model_dir, *_FLAGS, *flags)
  try:
    process.wait_for(pattern)
    if not flags:
      process.send()
    assert process.finish() == 42, process.output[-3000:]
  finally:
    process.kill()
  return int(re.search(r"preempted at step (\d+)", process.output).group(1))


def _csv_train_steps(model_dir) -> collections.Counter:
  with open(os.path.join(model_dir, "metrics.csv"), newline="") as f:
    return collections.Counter(int(row["step"]) for row in csv.DictReader(f)
                               if row["split"] == "train" and row["name"] == "loss")


def _tensorboard_train_steps(model_dir) -> collections.Counter:
  """The steps of every train `loss` event, over every run's event file."""
  from tensorboard.backend.event_processing import event_file_loader  # pylint: disable=import-outside-toplevel
  steps = collections.Counter()
  for path in glob.glob(os.path.join(model_dir, "tensorboard", "train", "events.out.tfevents.*")):
    for event in event_file_loader.LegacyEventFileLoader(path).Load():
      steps.update(event.step for value in event.summary.value if value.tag == "loss")
  return steps


def test_each_loop_logged_once_across_sigterms(tmp_path):
  """Catches the loop behind a stop never logged (it was not: the stop saved and exited
  before the boundary's progress action; issue 57's missing step 200), and a row logged
  again by the resumed run."""
  stops = [_stopped(tmp_path, r"step 10/"),                            # in a loop
           _stopped(tmp_path, r"checkpoint at step [2-9]\d started"),  # during a checkpoint
           _stopped(tmp_path, r"preempted at step", _AT_FIRST_BOUNDARY)]  # in a boundary
  assert stops == sorted(set(stops)) and stops[-1] < _STEPS, stops
  resumed = run_trainer(tmp_path, *_FLAGS)  # train.actions may change on a resume
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  every_loop = collections.Counter(range(_LOOP, _STEPS + 1, _LOOP))
  assert _csv_train_steps(tmp_path) == every_loop, stops
  assert _tensorboard_train_steps(tmp_path) == every_loop, stops
