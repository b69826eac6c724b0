"""Ray Tune: a sweep of distloop trials, each trial one model_dir (extra `[ray]`).

    def trial(params):                       # the user's Tune function trainable
      config = configs.get("synthetic")
      config.train.learning_rate = params["learning_rate"]
      ray_tune.run_trial(config, "/shared/sweep/model_dirs")

    tune.Tuner(trial, param_space={"learning_rate": tune.grid_search([...])},
               tune_config=tune.TuneConfig(scheduler=ray_tune.ASHA(metric="eval_loss",
                                           mode="min", max_t=STEPS, grace_period=...)),
               run_config=tune.RunConfig(name="sweep", storage_path=...)).fit()

(examples/ray_tune_sweep.py, docs/sweeps.md). `run_trial` is `trainer.run(config,
<root>/<Tune trial id>, mode="train_and_eval")` with Actions that save each eval's step and,
once it is committed (at the next loop boundary; the final eval after trainer.run returns),
call `ray.tune.report({"step", "eval_*", "train_loss"}, checkpoint=<pointer>)`: the pointer
is ray_train's (`distloop_checkpoint.json`: model_dir and step, not the weights), so
`ray_train.checkpoint_dir(result.checkpoint)` resolves a result to
`<model_dir>/checkpoints/<step>`. The trial id is kept by `Tuner.restore`, so a restored
trial runs again in its own model_dir and resumes from its latest checkpoint there,
exactly; if that step was saved but not reported (the driver died in between), its eval is
reported first, from metrics.csv. Tune's own checkpoint of the trial (the pointer) only says
which step Tune has.

A trial the scheduler stops: `tune.report` raises SystemExit in the reporting thread (Ray's
way to end a function trainable); the Action turns it into `trainer.Stop(...)`, but Ray
ends the trial's process moments later (measured: before the stop's save commits), so a
stopped trial's model_dir holds the checkpoint of its last reported eval and no
finished.json (a rerun of that model_dir would resume it). That is why a step is reported
only once committed: the checkpoint of every result exists.

`ASHA` is Ray's AsyncHyperBandScheduler on the reported `step` whose rungs survive a killed
driver: Tune's experiment state holds the trials, not the scheduler (TuneController's
`__getstate__` leaves `_scheduler_alg` out; `Tuner.restore` rebuilds it from tuner.pkl, as
it was before the first trial), so a restored driver's plain ASHA has forgotten every
result it ranked and decides otherwise than the unkilled sweep did. `ASHA` saves its state
beside the experiment state (in the driver's staging folder, which Tune uploads with each
snapshot and downloads on restore) and reloads it on restore.
"""
import json
import logging as std_logging
import os
import pickle
import time

from absl import logging

from trainer import ray_train
from trainer.errors import UserError
from trainer.loop.actions import Action, Stop
from trainer.reporters import metrics_log
from trainer.store import files
from trainer.store import model_dir as layout

STATE_FILE = "distloop_asha_state.pkl"  # beside Tune's experiment_state-*.json


def trial_model_dir(root: str, trial_id: str) -> str:
  """`<root>/<trial_id>`: a local folder or a bucket's URL (gs://, s3://), as trainer.run takes."""
  if "://" in root:
    return f"{root.rstrip('/')}/{trial_id}"
  return os.path.join(os.path.abspath(root), trial_id)


def run_trial(config, root: str, *, task=None, actions=()):
  """Inside a Tune function trainable: trains `config` in `<root>/<this trial's id>`,
  reporting each eval to Tune with a pointer to its step (module docstring). Returns
  trainer.run's summary; a trial run again (Tuner.restore) resumes its model_dir."""
  from ray import tune  # pylint: disable=g-import-not-at-top  (the [ray] extra)
  from trainer import api  # pylint: disable=g-import-not-at-top  (TensorFlow: in the trial only)
  # Ray sets TF_USE_LEGACY_KERAS=1 for Keras 2 users; distloop is Keras 3 (ray_train.py).
  os.environ.pop("TF_USE_LEGACY_KERAS", None)
  model_dir = trial_model_dir(root, tune.get_context().get_trial_id())
  logging.set_verbosity(logging.INFO)
  logging.info("Ray Tune trial %s: model_dir %s", tune.get_context().get_trial_id(), model_dir)
  if "://" not in model_dir:  # the killed driver's trial process may still hold the lock
    ray_train.wait_for_writer(model_dir)
  resumed_after = _pointer_step(tune.get_checkpoint())  # what Tune holds already
  reporter = EvalReporter(ray_train.Reporter(tune.report, model_dir, rank_zero=True,
                                             checkpoint_class=tune.Checkpoint),
                          reported_step=resumed_after)
  summary = api.run(config, model_dir, mode="train_and_eval", task=task, actions=[
      Action(reporter.restored, phase="restored", name="ray_tune_restored"),
      Action(reporter.at_boundary, every_boundary=True, name="ray_tune_report"),
      Action(reporter.after_eval, after_eval=True, name="ray_tune_eval"),
      *actions])
  reporter.at_end(summary)
  return summary


class EvalReporter:
  """Reports each eval to Tune once its step is committed, with the pointer to it.

  After an eval (step S) it asks for S's save ("save"); at the next loop boundary, S's
  checkpoint committed, it reports S's metrics and the pointer: Tune ends a trial it stops
  within moments (the process ends, a save under way is lost), so a step is reported only
  once it is on disk, and a stopped trial's last result names a checkpoint that exists.
  The final eval is reported after trainer.run returns (it waited for the final save).
  A report Tune answers with a stop (SystemExit in the reporting thread) becomes
  trainer.Stop: the run finishes there if Ray lets it (module docstring).
  A run resumed past the step Tune holds (its driver was killed after a save and before
  the report) reports the restored step's eval from metrics.csv first."""

  def __init__(self, reporter, *, reported_step: int | None = None):
    self._reporter = reporter  # ray_train.Reporter
    self.reported_step = reported_step
    self._pending = None  # (step, metrics) evaluated and saving, not reported yet
    self.stopped = False

  def restored(self, boundary) -> None:
    """At the "restored" phase: the restored step's eval, if Tune has not got it."""
    if boundary.step and (self.reported_step is None or boundary.step > self.reported_step):
      metrics = _csv_metrics(boundary.model_dir, boundary.step)
      if metrics is not None:
        logging.info("Ray Tune: step %d was saved but not reported before the restart; "
                     "reporting it now", boundary.step)
        self._pending = (boundary.step, metrics)

  def after_eval(self, boundary):
    if not boundary.eval:
      return None
    metrics = {"step": boundary.step, **{f"eval_{k}": v for k, v in boundary.eval.items()}}
    if "loss" in boundary.train:
      metrics["train_loss"] = boundary.train["loss"]
    self._pending = (boundary.step, _numbers(metrics))
    return None if boundary.final else "save"

  def at_boundary(self, boundary):
    """At every boundary (before after_eval's): the pending eval, once committed."""
    if self._pending is None or self.stopped or self._pending[0] >= boundary.step:
      return None
    return self._report_pending(boundary.model_dir)

  def _report_pending(self, model_dir: str):
    step, metrics = self._pending
    _wait_committed(model_dir, step)
    self._pending = None
    try:
      self._reporter.report(metrics, step)
    except SystemExit:  # Tune's stop: ray.train's session ends the trainable this way
      self.stopped = True
      logging.info("Ray Tune stopped this trial after the eval of step %d (its scheduler)",
                   step)
      return Stop(f"stopped by Ray Tune's scheduler after the eval of step {step}")
    self.reported_step = step
    return None

  def at_end(self, summary) -> None:
    """After trainer.run: the final eval (its step saved). A finished model_dir run again
    (trainer.run's quick no-op) reports its summary's, if Tune has not got that step."""
    if self.stopped or not isinstance(summary, dict) or summary.get("step") is None:
      return
    if self._pending is None and summary["step"] != self.reported_step:
      metrics = {k: v for k, v in _numbers(summary).items()
                 if k == "step" or k == "train_loss" or k.startswith("eval_")}
      self._pending = (summary["step"], metrics)
    if self._pending is not None:
      self._report_pending(None)


def _pointer_step(checkpoint) -> int | None:
  """The step a pointer Tune restored names (None: a fresh trial)."""
  if checkpoint is None:
    return None
  with checkpoint.as_directory() as directory:
    path = os.path.join(directory, ray_train.POINTER_FILE)
    if not os.path.isfile(path):
      return None
    with open(path, encoding="utf-8") as f:
      return int(json.load(f)["step"])


def _csv_metrics(model_dir: str, step: int) -> dict | None:
  """metrics.csv's eval values (and the train loss) at `step`, as after_eval reports them."""
  at_step = {split: values for at, split, values in
             metrics_log.MetricsLog(model_dir, enabled=True).rows(upto=step) if at == step}
  if not at_step.get("eval"):
    return None
  metrics = {"step": step, **{f"eval_{name}": value for name, value in at_step["eval"].items()}}
  if "loss" in at_step.get("train", {}):
    metrics["train_loss"] = at_step["train"]["loss"]
  return metrics


def _wait_committed(model_dir: str | None, step: int, seconds: float = 600.0) -> None:
  """Until `step`'s checkpoint is committed in `model_dir` (orbax saves in the
  background; a local folder's step appears whole). None: trainer.run has waited."""
  if model_dir is None or "://" in model_dir:
    return
  deadline = time.monotonic() + seconds
  while step not in layout.checkpoint_steps(model_dir) and time.monotonic() < deadline:
    time.sleep(0.05)


def _numbers(metrics: dict) -> dict:
  """Plain numbers and strings (numpy scalars as Python's); anything else left out."""
  kept = {}
  for key, value in metrics.items():
    if isinstance(value, (bool, int, float, str)):
      kept[key] = value
    elif hasattr(value, "item") and getattr(value, "shape", None) == ():
      kept[key] = value.item()
  return kept


try:  # the [ray] extra; without it ASHA() says so
  from ray.tune.schedulers import AsyncHyperBandScheduler as _Scheduler
except ImportError:  # pragma: no cover
  _Scheduler = object


class ASHA(_Scheduler):
  """Ray Tune's ASHA (AsyncHyperBandScheduler's arguments; `time_attr` defaults to the
  reported "step", not Tune's count of reports) whose rungs survive a killed and restored
  driver: its state is saved after each decision beside Tune's experiment state, and
  reloaded when a restored driver adds its first trial (module docstring)."""

  def __init__(self, **kwargs):
    if _Scheduler is object:
      raise UserError("ray_tune.ASHA needs Ray Tune: pip install -e '.[ray]'")
    kwargs.setdefault("time_attr", "step")
    super().__init__(**kwargs)
    self._state_path = None

  def _attach(self, trial) -> None:
    if self._state_path is not None:
      return
    path = os.path.join(trial.storage.experiment_driver_staging_path, STATE_FILE)
    if os.path.isfile(path):  # a restored experiment: the rungs as of its last snapshot
      with open(path, "rb") as f:
        self.__dict__.update(pickle.load(f))
      ranked = {t for bracket in self._brackets for _, recorded in bracket._rungs  # pylint: disable=protected-access
                for t in recorded}
      std_logging.getLogger("ray.tune").info(  # the driver's log (absl's is quiet there)
          "ASHA: restored the rungs of %d trials from %s", len(ranked), path)
    self._state_path = path

  def _save(self) -> None:
    state = {k: v for k, v in self.__dict__.items() if k != "_state_path"}
    files.write_bytes(self._state_path, pickle.dumps(state), what="the ASHA scheduler's state")

  def on_trial_add(self, tune_controller, trial):
    self._attach(trial)
    if trial.trial_id not in self._trial_info:  # a restored one's bracket is in the state
      super().on_trial_add(tune_controller, trial)
      self._save()

  def on_trial_result(self, tune_controller, trial, result):
    self._attach(trial)
    decision = super().on_trial_result(tune_controller, trial, result)
    self._save()
    return decision

  def on_trial_complete(self, tune_controller, trial, result):
    self._attach(trial)
    if trial.trial_id in self._trial_info:
      super().on_trial_complete(tune_controller, trial, result)
    self._save()

  def on_trial_remove(self, tune_controller, trial):
    self._attach(trial)
    self._trial_info.pop(trial.trial_id, None)
    self._save()
