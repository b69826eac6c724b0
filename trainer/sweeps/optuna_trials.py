"""Optuna: each trial one distloop run, each eval reported, a pruned trial stopped cleanly.

    def objective(trial):
        config = configs.get("synthetic")
        config.train.learning_rate = trial.suggest_float("learning_rate", 0.01, 1.0, log=True)
        return optuna_trials.run(trial, config, root="/tmp/sweep", metric="accuracy")

`run` trains `--mode=train_and_eval` in `<root>/trial_<N>` and reports each eval's
`metric` to the trial (`trial.report(value, step)`). At the first eval where
`trial.should_prune()`, the run stops as at its last step (a trainer.Stop: saved,
evaluated, exported; finished.json's reason names the pruner, the step and the value),
and `run` raises `optuna.TrialPruned`. Otherwise it returns the final eval's `metric`.

A study whose process died mid-trial resumes it: with an RDBStorage heartbeat and
`RetryHeartbeatStaleTrialCallback`, Optuna queues the dead trial again under a new
number; N is the *original* trial's number, so the retry trains on from that
model_dir's newest checkpoint, exactly, and first reports the evals the dead process
had reached (from metrics.csv): the pruner judges it on the history an unkilled trial
would have had. A trial whose run had finished (the study died before Optuna recorded
it) is not trained again: its evals are reported and its end is the one it had.
"""
import os

from trainer import api
from trainer.errors import UserError
from trainer.loop.actions import Action, Stop
from trainer.reporters import metrics_log
from trainer.store import mirror

try:
  import optuna
except ImportError:  # pragma: no cover - the extra is absent
  optuna = None

ACTION_NAME = "optuna_pruning"


def model_dir(trial, root: str) -> str:
  """`<root>/trial_<N>`: N the trial's number, or the original trial's for a retry."""
  number = _frozen(trial).system_attrs.get("failed_trial", trial.number)
  return os.path.join(root, f"trial_{number}")


def run(trial, config, *, root: str, metric: str, task=None, actions=()) -> float:
  """Trains `config` for `trial` (module docstring); the final eval's `metric`."""
  if optuna is None:
    raise UserError("Optuna is not installed: pip install -e '.[optuna]'")
  directory = model_dir(trial, root)
  reporter = _EvalReporter(trial, metric)
  summary = api.run(config, directory, mode="train_and_eval", task=task, actions=[
      *actions, Action(reporter.catch_up, phase="restored", name="optuna_catch_up"),
      Action(reporter.at_eval, after_eval=True, name=ACTION_NAME)])
  if summary.get("already_finished"):  # trained before: its evals, as a resume reports them
    reporter.report_logged(mirror.staged(directory, fresh=False), upto=summary["step"])
  if summary.get("stopped_early_by") == ACTION_NAME:
    raise optuna.TrialPruned(summary.get("stop_reason", "pruned"))
  key = f"eval_{metric}"
  if summary.get(key) is None:
    raise UserError(f"the run of trial {trial.number} reported no eval {metric!r} (choose "
                    f"from: {', '.join(k[5:] for k in summary if k.startswith('eval_'))})")
  return summary[key]


class _EvalReporter:
  """The trial's side of a run: each eval reported once, the prune decision taken."""

  def __init__(self, trial, metric: str):
    self._trial = trial
    self._metric = metric
    # The steps the trial holds (a retry may inherit some), read once: each report adds one.
    self._reported = set(_frozen(trial).intermediate_values)

  def at_eval(self, boundary) -> Stop | None:
    """after_eval: this eval reported; a Stop where the pruner says so."""
    if self._metric not in boundary.eval:
      raise UserError(f"optuna_trials.run(metric={self._metric!r}): the eval reports "
                      f"{', '.join(sorted(boundary.eval))}")
    value = boundary.eval[self._metric]
    self._report(boundary.step, value)
    if not self._trial.should_prune():
      return None
    pruner = type(self._trial.study.pruner).__name__
    return Stop(f"pruned by Optuna's {pruner} at step {boundary.step} (eval {self._metric} "
                f"{value:.6g})")

  def catch_up(self, boundary) -> None:
    """phase "restored": the evals up to the restored step (a dead process reached them;
    this trial may be its retry), reported before training goes on."""
    self.report_logged(boundary.model_dir, upto=boundary.step)

  def report_logged(self, local_model_dir: str, *, upto: int) -> None:
    """metrics.csv's evals up to step `upto`, each reported unless the trial has it."""
    logged = metrics_log.MetricsLog(local_model_dir, enabled=True).rows(upto)
    for step, split, values in logged:
      if split == "eval" and self._metric in values:
        self._report(step, values[self._metric])

  def _report(self, step: int, value: float) -> None:
    if step not in self._reported:
      self._trial.report(value, step)
      self._reported.add(step)


def _frozen(trial):
  """The trial as the storage holds it (a live Trial does not show its system attributes
  or the values it was reported)."""
  for frozen in trial.study.get_trials(deepcopy=False):
    if frozen.number == trial.number:
      return frozen
  raise UserError(f"trial {trial.number} is not in study {trial.study.study_name!r}")
