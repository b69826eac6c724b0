"""An Optuna study of distloop trials that prunes and resumes (docs/sweeps.md).

  pip install -e '.[optuna]'
  python examples/optuna_sweep.py [ROOT]      # ROOT: /tmp/distloop/optuna_sweep

Each trial trains the synthetic config with its own learning rate and width in
ROOT/trial_<N>, reports each eval's accuracy and is pruned by the MedianPruner where it
falls behind. The study is ROOT/study.db: kill this script mid-trial and run it again,
and the dead trial trains on from its model_dir's newest checkpoint, not from step 0.
"""
import os
import sys
import warnings

import optuna

import configs
from trainer.sweeps import optuna_trials

ROOT = sys.argv[1] if len(sys.argv) > 1 else "/tmp/distloop/optuna_sweep"
TRIALS = 6


def objective(trial):
  config = configs.get("synthetic")
  config.train.update(steps=200, optimizer="sgd", steps_per_loop=20,
                      learning_rate=trial.suggest_float("learning_rate", 1e-3, 0.3, log=True))
  config.model.dense_units = trial.suggest_int("dense_units", 8, 64, log=True)
  config.eval.interval = 40
  config.runtime.deterministic = True
  return optuna_trials.run(trial, config, root=ROOT, metric="accuracy")


warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)  # heartbeat, QMC
os.makedirs(ROOT, exist_ok=True)
storage = optuna.storages.RDBStorage(  # a heartbeat: a dead process's trial is run again
    f"sqlite:///{ROOT}/study.db", heartbeat_interval=1, grace_period=3,
    heartbeat_stale_trial_callback=optuna.storages.RetryHeartbeatStaleTrialCallback())
study = optuna.create_study(
    study_name="distloop", storage=storage, direction="maximize", load_if_exists=True,
    sampler=optuna.samplers.QMCSampler(seed=0),  # its place in the sequence is in the study
    pruner=optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=40))
ended = [t for t in study.trials if t.state.is_finished() and t.state.name != "FAIL"]
study.optimize(objective, n_trials=max(TRIALS - len(ended), 0))
for trial in study.trials:
  print(trial.number, trial.state.name, trial.value, trial.params, flush=True)
