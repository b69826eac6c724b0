"""runtime.mlflow_uri: the run's params, metrics and export in an MLflow tracking server.

The chief logs, through `MlflowClient` (no process-wide active run, so trainer.run in a
notebook leaves none behind): the resolved config as params when the MLflow run is created,
every value metrics.csv gets (`train/loss`, `eval/accuracy`, ... at their step), and at the
end the SavedModel as artifacts under `export/`. The MLflow run's id is kept in
model_dir/mlflow_run.json, so a resumed distloop run goes on logging into the same MLflow run.
MLflow cannot delete a metric's step: trainer/reporters/fan_out.py hands it no step twice
(a resume asks the run's history for the highest step it holds: `highest_steps`).

An optional extra (`pip install -e '.[mlflow]'`, the mlflow-skinny client): asking for it
without the client installed is refused before anything runs (trainer/setup/validation.py). A server that cannot be
reached at the start is refused in one line (exit 2); one that fails mid-run costs a
warning, never the training (fan_out.py runs each call in a thread of its own, waited
for at most 25 s, and not at all once a signal arrived: a server that stops answering
never holds a preempted run past its grace period). An MLflow run of mlflow_run.json that was deleted (or
purged) is no reason to refuse a resume: logging goes on in a new run, with a
warning naming both.
"""
import json
import os
import time

from absl import logging

from trainer.errors import UserError
from trainer.reporters import summaries
from trainer.reporters.contract import Reporter
from trainer.store import files
from trainer.store import mirror

# Fail fast instead of MLflow's default of minutes of retries.
_CLIENT_SETTINGS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "20"}
# distloop's own keys, logged at every loop boundary and every eval: their history's
# highest step is the highest step of the split that MLflow holds.
_EVERY_ROW = {"train": "train/steps_per_sec", "eval": "eval/examples"}


class MlflowLog(Reporter):
  """runtime.loggers' `mlflow` (contract.py): one distloop run's MLflow run."""

  def __init__(self, runtime_config, model_dir: str):
    self._uri = runtime_config.mlflow_uri
    self._experiment = runtime_config.mlflow_experiment
    self._model_dir = model_dir
    self._enabled = bool(self._uri)  # runtime.loggers=mlflow without a URI is refused
    self._client = self._run_id = None

  @property
  def run_id(self) -> str | None:
    return self._run_id

  def check(self) -> None:
    self.connect()

  def connect(self) -> None:
    """UserError if the server cannot be reached: called before the run writes or moves
    anything in model_dir (a refused run writes nothing); reads only."""
    if not self._enabled or self._client is not None:
      return
    for key, value in _CLIENT_SETTINGS.items():
      os.environ.setdefault(key, value)
    from mlflow import MlflowClient  # pylint: disable=g-import-not-at-top  (optional extra)
    try:
      client = MlflowClient(tracking_uri=self._uri)
      client.get_experiment_by_name(self._experiment)
    except Exception as error:  # pylint: disable=broad-except  (any client or HTTP failure)
      raise self._unreachable(error) from None
    self._client = client

  def _unreachable(self, error: Exception) -> UserError:
    return UserError(f"runtime.mlflow_uri={self._uri!r}: cannot log to MLflow "
                     f"({type(error).__name__}: {str(error).splitlines()[0][:200]})")

  def start(self, config_dict: dict, model_dir: str | None = None) -> None:
    """Creates the MLflow run (params: the flattened config), or reopens the one this
    model_dir logged into before. UserError if the server cannot be reached."""
    if not self._enabled:
      return
    self.connect()
    from mlflow.entities import Param  # pylint: disable=g-import-not-at-top  (optional extra)
    path = os.path.join(self._model_dir, "mlflow_run.json")
    try:
      known = _read(path)
      gone = (_gone(self._client, known["run_id"])
              if known.get("tracking_uri") == self._uri else None)
      if known.get("tracking_uri") == self._uri and gone is None:
        self._run_id = known["run_id"]
        self._client.update_run(self._run_id, status="RUNNING")
        logging.info("MLflow: logging on into run %s at %s", self._run_id, self._uri)
        return
      if gone is not None:
        logging.warning("MLflow: run %s of this model_dir (%s) %s at %s: logging into a new "
                        "run from here on", known["run_id"], path, gone, self._uri)
      experiment = self._client.get_experiment_by_name(self._experiment)
      experiment_id = (experiment.experiment_id if experiment is not None
                       else self._client.create_experiment(self._experiment))
      run = self._client.create_run(
          experiment_id, run_name=os.path.basename(os.path.normpath(
              mirror.display(self._model_dir))),
          tags={"distloop.model_dir": mirror.display(os.path.abspath(self._model_dir))})
      self._run_id = run.info.run_id
      params = [Param(key, str(value)[:6000])
                for key, value in summaries.flatten_config(config_dict).items()]
      for start in range(0, len(params), 100):  # MLflow's limit per batch
        self._client.log_batch(self._run_id, params=params[start:start + 100])
    except Exception as error:  # pylint: disable=broad-except  (any client or HTTP failure)
      raise self._unreachable(error) from None
    files.write_text(path, json.dumps({"tracking_uri": self._uri, "run_id": self._run_id}),
                     what="the MLflow run file")
    logging.info("MLflow: run %s in experiment %r at %s", self._run_id, self._experiment,
                 self._uri)

  def highest_steps(self) -> dict:
    """{split: the highest step the MLflow run holds} ({} for a new run)."""
    found = {}
    for split, key in _EVERY_ROW.items():
      steps = [metric.step for metric in self._client.get_metric_history(self._run_id, key)]
      if steps:
        found[split] = max(steps)
    return found

  def write(self, step: int, split: str, values: dict) -> None:
    from mlflow.entities import Metric  # pylint: disable=g-import-not-at-top
    now = int(time.time() * 1000)
    metrics = [Metric(f"{split}/{name}", float(value), now, step)
               for name, value in values.items()]
    self._client.log_batch(self._run_id, metrics=metrics)

  def finish(self, summary: dict, export_dir: str | None) -> None:
    """The SavedModel as artifacts under export/<step>/; the MLflow run ends FINISHED."""
    if export_dir and os.path.isdir(export_dir):
      self._client.log_artifacts(self._run_id, export_dir,
                                 f"export/{os.path.basename(export_dir)}")
    self._client.set_terminated(self._run_id, "FINISHED")


def _gone(client, run_id: str) -> str | None:
  """Why the MLflow run `run_id` cannot be logged into ("was deleted", "no longer
  exists"), or None. Other failures (the server cannot be reached) are raised."""
  from mlflow.exceptions import MlflowException  # pylint: disable=g-import-not-at-top
  try:
    run = client.get_run(run_id)
  except MlflowException as error:
    if error.error_code == "RESOURCE_DOES_NOT_EXIST":
      return "no longer exists"
    raise
  return "was deleted" if run.info.lifecycle_stage == "deleted" else None


def _read(path: str) -> dict:
  try:
    with open(path) as f:
      return json.load(f)
  except (OSError, ValueError):
    return {}
