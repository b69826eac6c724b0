"""Optuna (trainer/sweeps/optuna_trials.py, examples/optuna_sweep.py): a study of 6 trials
x 200 steps prunes, a pruned trial says so in finished.json, a trial run again alone
equals its run in the study, and a study SIGKILLed mid-trial and rerun ends with the
unkilled study's trials, its dead trial resumed from its model_dir.

The study runs as the example does (`python examples/optuna_sweep.py ROOT`), in a child
process: the killed one is a process, and the others must not share this worker's
TensorFlow."""
import importlib.util
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time

import pytest

from tests.support.cli import REPO, train_ok, user_environment
from tests.support.processes import (TrainerProcess, assert_same_state, checkpoint_arrays,
                                     dies_with_its_test)

pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    importlib.util.find_spec("optuna") is None,
    reason="Optuna is not installed (pip install -e '.[optuna]'; .ci/run installs it for the "
           "slow tests)")]

_TRIAL_LINE = re.compile(r"^(\d+) (COMPLETE|PRUNED|FAIL|RUNNING|WAITING) (\S+) (\{.*\})$")


def _study(root, *, kill_in_trial: int | None = None) -> TrainerProcess:
  """The example's study in ROOT; `kill_in_trial`: SIGKILLed after that trial's step 140
  (its checkpoint at 100 on disk, 40 steps past it)."""
  study = TrainerProcess(None, str(root), module="examples.optuna_sweep")
  if kill_in_trial is not None:
    study.wait_for(rf"Trial {kill_in_trial - 1} (finished|pruned)", timeout=600)
    study.wait_for(r"\bstep 140/200\b", timeout=600)
    study.process.send_signal(signal.SIGKILL)
    study.process.wait(60)
    return study
  assert study.finish(600) == 0, "".join(study.lines[-30:])
  return study


def _trials(study: TrainerProcess) -> list[tuple[int, str, float, dict]]:
  """The example's last lines: number, state, value, params of every trial."""
  found = []
  for line in study.lines:
    match = _TRIAL_LINE.match(line.strip())
    if match:
      number, state, value, params = match.groups()
      found.append((int(number), state, None if value == "None" else float(value),
                    eval(params)))  # noqa: S307  the example's own print of a dict
  return found


def _ended(trials) -> dict:
  """{params: (state, value)} of the trials that ended (a dead one's retry counts)."""
  return {tuple(sorted(params.items())): (state, value) for _, state, value, params in trials
          if state in ("COMPLETE", "PRUNED")}


@pytest.fixture(scope="module")
def unkilled(tmp_path_factory):
  root = tmp_path_factory.mktemp("optuna") / "study"
  return root, _trials(_study(root))


def test_a_study_prunes_and_each_pruned_trial_says_who_pruned_it(unkilled):
  root, trials = unkilled
  assert len(trials) == 6 and {state for _, state, _, _ in trials} <= {"COMPLETE", "PRUNED"}
  pruned = [number for number, state, _, _ in trials if state == "PRUNED"]
  assert pruned and len(pruned) < 6, trials
  for number, state, value, _ in trials:
    with open(root / f"trial_{number}" / "finished.json") as f:
      finished = json.load(f)
    with open(root / f"trial_{number}" / "summary.json") as f:
      summary = json.load(f)
    if state == "COMPLETE":
      assert finished["reason"] == "train.steps" and finished["step"] == 200
      assert value == summary["eval_accuracy"]
      continue
    # a clean stop at the eval that was pruned: saved, evaluated, exported; the value the
    # study holds is that eval's
    step = finished["step"]
    assert step < 200 and step % 40 == 0 and summary["step"] == step
    assert re.fullmatch(rf"stopped by optuna_pruning: pruned by Optuna's MedianPruner at step "
                        rf"{step} \(eval accuracy [0-9.e-]+\)", finished["reason"]), finished
    assert summary["stop_reason"] in finished["reason"]
    assert value == summary["eval_accuracy"]
    assert os.path.isdir(root / f"trial_{number}" / "export" / str(step))
    assert os.path.isdir(root / f"trial_{number}" / "checkpoints" / str(step))


def test_a_trial_run_again_alone_equals_its_run_in_the_study(unkilled, tmp_path):
  """The config a trial recorded, trained by the CLI in a fresh model_dir: the same
  eval, the same weights (0.0)."""
  root, trials = unkilled
  number = next(number for number, state, _, _ in trials if state == "COMPLETE")
  trial_dir = root / f"trial_{number}"
  alone = train_ok(tmp_path / "alone", f"--config={trial_dir / 'config.json'}",
                   "--mode=train_and_eval")
  with open(trial_dir / "summary.json") as f:
    in_study = json.load(f)
  assert alone["eval_accuracy"] == in_study["eval_accuracy"]
  assert alone["eval_loss"] == in_study["eval_loss"]
  assert_same_state(checkpoint_arrays(tmp_path / "alone", 200),
                    checkpoint_arrays(trial_dir, 200), atol=0.0)


def test_a_pruned_trials_job_passes_trainer_verify(unkilled, tmp_path):
  """`python -m trainer.verify` on the config a pruned trial recorded: its job resumes
  bit for bit from SIGTERM and SIGKILL, and its eval and export equal fresh processes'."""
  root, trials = unkilled
  number = next(number for number, state, _, _ in trials if state == "PRUNED")
  completed = subprocess.run(
      [*dies_with_its_test(), sys.executable, "-m", "trainer.verify",
       f"--config={root / f'trial_{number}' / 'config.json'}", "--shapes=1", "--steps=8",
       f"--scratch={tmp_path}"], cwd=REPO, capture_output=True, text=True, timeout=600,
      env=user_environment())
  assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
  verdicts = re.findall(r"^(repeat|sigterm|sigkill|eval twice|eval|export) +(\w+)",
                        completed.stdout, re.M)
  assert len(verdicts) == 6 and all(v == "holds" for _, v in verdicts), completed.stdout


def test_a_study_killed_mid_trial_and_rerun_ends_as_the_unkilled_one(unkilled, tmp_path):
  root, trials = unkilled
  killed_in = next(number for number, state, _, _ in trials if state == "COMPLETE" and number > 1)
  study_root = tmp_path / "study"
  _study(study_root, kill_in_trial=killed_in)
  assert not os.path.exists(study_root / f"trial_{killed_in}" / "finished.json")
  time.sleep(4)  # Optuna's grace period (3 s in the example): the dead trial is stale
  rerun = _study(study_root)
  rerun_trials = _trials(rerun)
  assert _ended(rerun_trials) == _ended(trials)
  # The dead trial failed and was run again under a new number, in its own model_dir,
  # from its checkpoint at step 100 (not from step 0).
  failed = [number for number, state, _, _ in rerun_trials if state == "FAIL"]
  assert failed == [killed_in], rerun_trials
  # 6 model_dirs, as unkilled (the retry took a number, not a model_dir)
  assert len([name for name in os.listdir(study_root) if name.startswith("trial_")]) == 6
  assert any(re.search(r"Restored checkpoint at step 100\b", line) for line in rerun.lines)
  with sqlite3.connect(study_root / "study.db") as db:
    retried = db.execute("SELECT trial_id, value_json FROM trial_system_attributes "
                         "WHERE key='failed_trial'").fetchall()
  assert [json.loads(value) for _, value in retried] == [killed_in]
  # The pruner judged the retry on the history the unkilled trial had: every eval from
  # step 40 on, those the dead process reported sent again from metrics.csv.
  assert (_intermediate_values(study_root, trial_id=retried[0][0]) ==
          _intermediate_values(root, number=killed_in))


def _intermediate_values(root, *, trial_id=None, number=None) -> dict:
  with sqlite3.connect(root / "study.db") as db:
    if trial_id is None:
      (trial_id,), = db.execute("SELECT trial_id FROM trials WHERE number=?", (number,))
    rows = db.execute("SELECT step, intermediate_value FROM trial_intermediate_values "
                      "WHERE trial_id=?", (trial_id,)).fetchall()
  assert rows, (root, trial_id, number)
  return dict(rows)


def test_a_trial_whose_run_ended_before_the_study_heard_ends_as_it_did(tmp_path):
  """The study died after a trial's run had finished (pruned) but before Optuna recorded
  it: the trial run again trains nothing, reports the evals its run made, and is pruned
  again with the same value."""
  import optuna  # pylint: disable=g-import-not-at-top
  import configs  # pylint: disable=g-import-not-at-top
  from trainer.sweeps import optuna_trials  # pylint: disable=g-import-not-at-top

  class PruneFromStep20(optuna.pruners.BasePruner):
    def prune(self, study, trial):
      return trial.last_step >= 20

  config = configs.get("synthetic")
  config.train.update(steps=60, steps_per_loop=10, optimizer="sgd")
  config.eval.interval = 10
  heard = []
  for _ in range(2):  # the same trial number in a study that lost its record
    study = optuna.create_study(direction="maximize", pruner=PruneFromStep20())
    trial = study.ask()
    with pytest.raises(optuna.TrialPruned, match="pruned by Optuna's PruneFromStep20 at step 20"):
      optuna_trials.run(trial, config, root=str(tmp_path), metric="accuracy")
    heard.append(study.get_trials()[0].intermediate_values)
  assert sorted(heard[0]) == [10, 20] and heard[1] == heard[0]
