"""Ray Tune sweeps (examples/ray_tune_sweep.py, trainer/sweeps/ray_tune.py): 4 trials one
at a time under ASHA on a local Ray cluster; ASHA stops some early, every result's
checkpoint resolves into its trial's model_dir, and a driver SIGKILLed in the middle of a
trial and run again (Tuner.restore) ends with the results of the unkilled sweep, the killed
trial resumed from its model_dir.

The sweeps run in the private network namespace of the multi-process tests
(tests/support/processes.py), as tests/cluster/test_ray.py's Ray jobs."""
import importlib.util
import json
import os
import re
import signal
import time
import types

import pytest

from tests.support.processes import (TrainerProcess, checkpoint_arrays, loopback_only,
                                     needs_loopback)

pytestmark = pytest.mark.slow  # python -m pytest -m slow (CI runs these too)

_RAY = importlib.util.find_spec("ray") is not None
needs_ray = pytest.mark.skipif(not _RAY, reason="Ray is not installed (pip install -e "
                               "'.[ray]'; .ci/run installs it for the slow tests)")

_STEPS = 60  # examples/ray_tune_sweep.py's
_RAY_ENV = {"RAY_DEDUP_LOGS": "0", "RAY_USAGE_STATS_ENABLED": "0"}
_HANG = 420  # seconds: far above a healthy sweep here (~45 s)


def _sweep(path) -> TrainerProcess:
  """The example's driver on a local Ray cluster; what it read goes to <path>.result.json."""
  return TrainerProcess(None, str(path), module="tests.support.ray_tune_job",
                        env={**_RAY_ENV, "RAY_TUNE_RESULT": f"{path}.result.json"},
                        prefix=loopback_only())


def _read(path) -> dict:
  return json.loads(open(f"{path}.result.json", encoding="utf-8").read())


def _outcome(read: dict) -> list:
  """Per trial, in grid order: its learning rate, last result (step, eval and train loss
  values), whether ASHA stopped it and the steps Tune holds results of (each eval once:
  none lost, none sent twice): what a killed and restored sweep must reproduce."""
  return [(t["learning_rate"], t["metrics"], t["metrics"]["step"] < _STEPS, t["steps"])
          for t in read["trials"]]


def _kill_the_rest(namespace: str) -> None:
  """SIGKILLs what is left in the killed driver's private network namespace: processes
  this test started (Ray's dashboard and runtime-env agents outlive the driver by ~1 min)."""
  for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
      if os.readlink(f"/proc/{pid}/ns/net") == namespace:
        os.kill(int(pid), signal.SIGKILL)
    except OSError:
      pass


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
  """One unkilled sweep: (what its driver read, its path, its output)."""
  if not _RAY:
    pytest.skip("Ray is not installed")
  path = tmp_path_factory.mktemp("ray_tune") / "sweep"
  job = _sweep(path)
  assert job.finish(_HANG) == 0, job.output[-4000:]
  return _read(path), path, job.output


@needs_ray
@needs_loopback
def test_asha_stops_trials_early_and_their_checkpoints_stay_readable(sweep):
  read, path, _ = sweep
  steps = [t["metrics"]["step"] for t in read["trials"]]
  assert [t["learning_rate"] for t in read["trials"]] == [0.03, 0.001, 0.1, 0.05]
  assert sum(step < _STEPS for step in steps) >= 1, steps  # measured: [60, 10, 60, 20]
  for trial in read["trials"]:
    model_dir = path / "model_dirs" / trial["trial_id"]  # one model_dir per trial id
    step = trial["metrics"]["step"]
    # A stopped trial's last result names a committed step of its own model_dir too.
    assert trial["checkpoint_dir"] == str(model_dir / "checkpoints" / str(step)), trial
    assert trial["steps"] == list(range(10, step + 1, 10)), trial  # each eval, once
    finished = (model_dir / "finished.json").exists()
    assert finished == (step == _STEPS), trial  # Ray ends a stopped trial's process


@needs_ray
@needs_loopback
def test_the_best_result_names_a_checkpoint_in_its_trials_model_dir(sweep):
  read, path, _ = sweep
  best = read["best"]
  losses = {t["trial_id"]: t["metrics"]["eval_loss"] for t in read["trials"]}
  assert best["trial_id"] == min(losses, key=losses.get)
  model_dir = path / "model_dirs" / best["trial_id"]
  assert best["checkpoint_dir"] == str(model_dir / "checkpoints" / str(_STEPS))
  checkpoint_arrays(model_dir, _STEPS)  # plain orbax reads it


@needs_ray
@needs_loopback
def test_a_killed_and_restored_driver_ends_with_the_unkilled_results(sweep, tmp_path):
  unkilled, _, _ = sweep
  path = tmp_path / "sweep"
  job = _sweep(path)
  # The third trial (learning rate 0.1: ASHA lets it run), killed once its step 20 is saved:
  # its eval of step 10 is in ASHA's rungs; a restored plain ASHA (rungs forgotten) would
  # let the fourth trial past step 10, where the unkilled sweep stopped it.
  try:
    match = job.wait_for(r"Ray Tune trial (\w+_00002): model_dir (\S+)", timeout=_HANG)
    trial_id, saved = match.group(1), os.path.join(match.group(2), "checkpoints", "20")
    deadline = time.monotonic() + _HANG
    while not os.path.isdir(saved) and time.monotonic() < deadline:
      time.sleep(0.02)  # its log reaches the driver late: the trial is ~1 s long
    namespace = os.readlink(f"/proc/{job.process.pid}/ns/net")
    os.kill(job.process.pid, signal.SIGKILL)  # the driver only: Ray's cluster goes with it
    job.wait(60)
    _kill_the_rest(namespace)  # ...but for 2 agents that linger for a minute
  finally:
    job.kill()
  restored = _sweep(path)
  assert restored.finish(_HANG) == 0, restored.output[-4000:]
  read = _read(path)
  assert _outcome(read) == _outcome(unkilled)
  assert read["trials"][2]["trial_id"] == trial_id  # Tune kept its id, and its model_dir
  # Resumed from its model_dir (a committed eval step), not trained again from step 0.
  resumed = [int(s) for s in re.findall(r"Restored checkpoint at step (\d+)", restored.output)]
  assert len(resumed) == 1 and 20 <= resumed[0] < _STEPS, (resumed, restored.output[-4000:])
  assert read["trials"][2]["steps"][-1] == _STEPS, read["trials"][2]
  assert "ASHA: restored the rungs of 3 trials" in restored.output, restored.output[-4000:]
  assert read["trials"][2]["checkpoint_dir"].endswith(f"{trial_id}/checkpoints/{_STEPS}")


def test_asha_state_survives_a_new_scheduler(tmp_path):
  """The scheduler of a restored driver (rebuilt from tuner.pkl, empty) reads the rungs
  the killed one saved beside the experiment state; a plain ASHA would let trial c run."""
  if not _RAY:
    pytest.skip("Ray is not installed")
  from trainer.sweeps import ray_tune  # pylint: disable=g-import-not-at-top

  def trial(name):
    storage = types.SimpleNamespace(experiment_driver_staging_path=str(tmp_path))
    return types.SimpleNamespace(trial_id=name, storage=storage)

  def asha():
    return ray_tune.ASHA(metric="eval_loss", mode="min", max_t=60, grace_period=10,
                         reduction_factor=2)

  first = asha()
  for name, loss in (("a", 2.0), ("b", 1.0)):  # b better than a: both go on
    first.on_trial_add(None, trial(name))
    assert first.on_trial_result(None, trial(name), {"step": 10, "eval_loss": loss}) == "CONTINUE"
  assert (tmp_path / ray_tune.STATE_FILE).is_file()
  second = asha()  # the restored driver's
  second.on_trial_add(None, trial("c"))
  assert second.on_trial_result(None, trial("c"), {"step": 10, "eval_loss": 3.0}) == "STOP"
  (tmp_path / ray_tune.STATE_FILE).unlink()
  plain = asha()
  plain.on_trial_add(None, trial("c"))
  assert plain.on_trial_result(None, trial("c"), {"step": 10, "eval_loss": 3.0}) == "CONTINUE"
