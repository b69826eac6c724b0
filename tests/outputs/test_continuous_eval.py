"""`--mode=continuous_eval` beside a live training job, and `--mode=eval --checkpoint_step=N`.

The sidecar and the job run as a user runs them (the CLI, two processes, one
model_dir); the polling logic is also tested alone with a fake trainer and clock.
"""
import glob
import json
import os
import re

import pytest
from tensorboard.backend.event_processing import event_accumulator

from tests.support.cli import run_trainer
from tests.support.processes import TrainerProcess
from trainer.loop import continuous_eval
from trainer.errors import UserError

pytestmark = pytest.mark.slow  # python -m pytest -m slow (CI runs these too)

_STEPS = 400
_SAVED = list(range(50, _STEPS + 1, 50))
# Retention keeps every step: what the sidecar sees then does not depend on how fast the
# job runs beside it (retention deleting steps under it: the fake-trainer tests below).
_JOB = ("--config=synthetic", f"--config.train.steps={_STEPS}", "--config.checkpoint.interval=50",
        f"--config.checkpoint.max_to_keep={len(_SAVED)}", "--config.eval.poll_seconds=1")


@pytest.fixture(scope="module")
def live_job(tmp_path_factory):
  """(model_dir, sidecar output, {step: eval accuracy} the sidecar logged, its pid)."""
  model_dir = tmp_path_factory.mktemp("live") / "run"  # nothing there yet, not even the dir
  sidecar = TrainerProcess(model_dir, *_JOB, "--mode=continuous_eval")
  job = None
  try:
    sidecar.wait_for(r"continuous_eval: watching", timeout=120)  # polling before any checkpoint
    job = TrainerProcess(model_dir, *_JOB)
    assert job.wait(timeout=180) == 0, job.output[-4000:]
    assert sidecar.wait(timeout=120) == 0, sidecar.output[-4000:]
  finally:
    for process in (sidecar, job):
      if process is not None:
        process.kill()
  evaluated = {int(step): float(accuracy) for step, accuracy in re.findall(
      r"eval at step (\d+) \| loss \S+ \| accuracy (\S+) \|", sidecar.output)}
  return model_dir, sidecar.output, evaluated, sidecar.process.pid


def test_sidecar_evaluates_new_checkpoints_up_to_the_final_step(live_job):
  _, output, evaluated, _ = live_job
  assert list(evaluated) == _SAVED, output  # every step once, oldest first
  assert f"evaluated {len(_SAVED)} checkpoint(s); the final step {_STEPS} is done" in output
  assert "Traceback" not in output and "skipped step" not in output


def test_sidecar_writes_eval_scalars_at_each_step(live_job):
  model_dir, _, evaluated, pid = live_job
  # The job's own final eval writes to tensorboard/eval too: read the sidecar's file.
  files = [f for f in glob.glob(f"{model_dir}/tensorboard/eval/events.out.tfevents.*")
           if f".{pid}." in os.path.basename(f)]
  assert len(files) == 1, os.listdir(f"{model_dir}/tensorboard/eval")
  accumulator = event_accumulator.EventAccumulator(files[0],
                                                   size_guidance={event_accumulator.TENSORS: 0})
  accumulator.Reload()
  for tag in ("loss", "accuracy"):
    assert [event.step for event in accumulator.Tensors(tag)] == list(evaluated), tag


def test_sidecar_never_writes_into_checkpoints(live_job):
  model_dir, _, _, _ = live_job
  assert sorted(map(int, os.listdir(model_dir / "checkpoints"))) == _SAVED
  assert not (model_dir / "checkpoints_corrupt").exists()


def test_eval_of_a_given_step_and_of_a_missing_one(live_job):
  model_dir, _, evaluated, _ = live_job
  result = run_trainer(model_dir, *_JOB, "--mode=eval", "--checkpoint_step=350", timeout=120)
  assert result.returncode == 0, result.stderr[-4000:]
  metrics = json.loads(result.stdout.strip().splitlines()[-1])
  assert metrics["step"] == 350 and metrics["examples"] == 2000
  # The sidecar evaluated these weights too.
  assert metrics["accuracy"] == pytest.approx(evaluated[350], abs=1e-4)

  result = run_trainer(model_dir, *_JOB, "--mode=eval", "--checkpoint_step=120", timeout=120)
  assert result.returncode == 2
  assert len(result.error_lines()) == 1, result.stderr
  assert "--checkpoint_step=120" in result.stderr and ", ".join(map(str, _SAVED)) in result.stderr


# -- the polling logic alone: a fake trainer, a fake clock ----------------------------


class _FakeCheckpoints:

  def __init__(self, directory):
    self.directory = str(directory)
    self.on_disk: list[int] = []
    self._listed: list[int] = []

  def reload(self):
    self._listed = list(self.on_disk)

  def all_steps(self):
    return sorted(self._listed)


class _FakeTrainer:
  """Checkpoint steps appear on a schedule of fake time; `unreadable` fail to restore."""

  def __init__(self, directory, clock, schedule: dict, unreadable=(), other_model=(),
               deleted_mid_read=()):
    self.checkpoints = _FakeCheckpoints(directory)
    self.clock, self.schedule, self.unreadable = clock, schedule, set(unreadable)
    self.other_model, self.deleted_mid_read = set(other_model), set(deleted_mid_read)
    self.evaluated, self.saved = [], set()

  def appear(self):
    for at, steps in self.schedule.items():
      if at <= self.clock.now:
        for step in set(steps) - self.saved:
          os.makedirs(os.path.join(self.checkpoints.directory, str(step)))
          self.checkpoints.on_disk.append(step)
          self.saved.add(step)
    for step in sorted(self.checkpoints.on_disk)[:-2]:  # retention: the newest two stay
      os.rmdir(os.path.join(self.checkpoints.directory, str(step)))
      self.checkpoints.on_disk.remove(step)

  def restore(self, step):
    if step in self.deleted_mid_read:  # its metadata went first: it looks like another model
      os.rmdir(os.path.join(self.checkpoints.directory, str(step)))
      self.checkpoints.on_disk.remove(step)
    if step in self.other_model | self.deleted_mid_read:
      raise UserError(f"step {step} was written by a different model")
    return None if step in self.unreadable else step

  def evaluate(self, step):
    self.clock.now += 3  # an eval takes a while: retention may delete steps meanwhile
    self.appear()
    self.evaluated.append(step)
    return {}


class _FakeClock:

  def __init__(self):
    self.now = 0.0
    self.trainer = None

  def __call__(self):
    return self.now

  def sleep(self, seconds):
    self.now += seconds
    self.trainer.appear()


def _sidecar(tmp_path, schedule, timeout_seconds=60.0, **failures):
  clock = _FakeClock()
  trainer = _FakeTrainer(tmp_path / "checkpoints", clock, schedule, **failures)
  clock.trainer = trainer
  return continuous_eval.ContinuousEval(trainer, final_step=400, poll_seconds=5,
                                        timeout_seconds=timeout_seconds, clock=clock,
                                        sleep=clock.sleep), trainer


def test_every_step_in_order_skipping_the_deleted_and_unreadable(tmp_path):
  # No checkpoints folder until t=10, then 100 and 150 together; 200 and 250 appear while
  # 100 is evaluated, so retention deletes 150 before it is read; 200 is deleted while it
  # is read; 300 is unreadable.
  evaluator, trainer = _sidecar(tmp_path, {10: [100, 150], 12: [200, 250], 20: [300],
                                           30: [400]}, unreadable=[300], deleted_mid_read=[200])
  assert evaluator.run() == trainer.evaluated == [100, 250, 400]
  assert evaluator.skipped == [150, 200, 300]


def test_checkpoints_of_another_model_are_refused(tmp_path):
  evaluator, _ = _sidecar(tmp_path, {0: [100]}, other_model=[100])
  with pytest.raises(UserError, match="different model"):
    evaluator.run()


def test_no_new_checkpoint_for_timeout_seconds_fails(tmp_path):
  evaluator, trainer = _sidecar(tmp_path, {10: [100]}, timeout_seconds=60)
  with pytest.raises(continuous_eval.Unfinished, match=r"no new checkpoint in 60 s .*step 100"):
    evaluator.run()
  assert trainer.evaluated == [100]
  assert trainer.clock.now == pytest.approx(10 + 3 + 60)  # counted from the last new step


def test_an_unreadable_final_step_fails_at_once(tmp_path):
  evaluator, _ = _sidecar(tmp_path, {0: [350, 400]}, unreadable=[400], timeout_seconds=0)
  with pytest.raises(continuous_eval.Unfinished, match="final step 400 .* could not be read"):
    evaluator.run()
