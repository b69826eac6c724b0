"""runtime.loggers: the run's reporters (contract.py), called together, each step once.

`Reporters` hands every call to each selected reporter. The ones that write model_dir
(TensorBoard, metrics.csv) are the store's: a full disk there is the run's failure (one
line, exit 1). The trackers (MLflow, W&B, a user's class) run each call in a thread of
its own, waited for at most 25 s and not past a signal (a tracker never holds a
preempted run; its close gets 5 s), and a failure costs one warning: that tracker hears
nothing more, training goes on.

A tracker that cannot delete what it logged (`can_rewind` False) is handed no step it
holds already: the highest step of each split it was handed is kept in
model_dir/reporters.json (written after each write that reached it), with its tracker
run id. Where the tracker can say what it holds (`highest_steps()`: MLflow's history,
W&B's resumed run or its offline logs), that is what counts on a resume; and what it
lacks up to the restored step (W&B writes its log every 15 s: a SIGKILL loses the rest)
is sent again from metrics.csv, which holds every step up to there.
"""
from absl import logging

from trainer.cluster import preemption
from trainer.errors import StorageError, UserError
from trainer.reporters.contract import Reporter
from trainer.setup.loggers import selected_loggers as selected
from trainer.store import files
from trainer.store import model_dir as layout

CALL_SECONDS = 25.0  # the longest a tracker's call is waited for
START_SECONDS = 120.0  # a tracker's check and start (W&B starts a service process)
CLOSE_GRACE_SECONDS = 5.0  # a tracker's close after a signal (W&B writes out its log)


class Reporters:
  """[(label, Reporter)], on the chief of a run that trains (`enabled`), else none."""

  def __init__(self, named: list[tuple[str, Reporter]], model_dir: str, *, enabled: bool,
               history=None):
    self._active = list(named) if enabled else []
    self._model_dir = model_dir
    self._history = history  # metrics.csv (metrics_log.MetricsLog): what a tracker missed
    self._held = {}  # label -> {"run": tracker run id, split: highest step handed}

  @property
  def labels(self) -> list[str]:
    return [label for label, _ in self._active]

  def check(self) -> None:
    """UserError (exit 2) if a reporter cannot report: before anything is written."""
    for label, reporter in self._active:
      self._refused_on_failure(label, "check", reporter.check)

  def start(self, config: dict, step: int) -> None:
    """Each reporter's start, then rewind(step): the step training goes on from."""
    held = files.read_json(layout.reporters_path(self._model_dir)) or {}
    logged = None  # metrics.csv's rows up to `step`, read once for every tracker
    for label, reporter in self._active:
      self._refused_on_failure(label, "start", reporter.start, config, self._model_dir)
      if reporter.can_rewind:
        continue
      run = reporter.run_id
      mine = held.get(label, {})
      self._held[label] = dict(mine) if mine.get("run") == run else {"run": run}
      # what the tracker says it holds is what it holds
      steps = self._call(label, reporter, "highest_steps", reporter.highest_steps)
      if steps is not None:
        self._held[label] = {"run": run, **steps}
      if self._history is not None and self._lacks(label, step):
        logged = self._history.rows(upto=step) if logged is None else logged
        self._catch_up(label, reporter, logged)
    self.rewind(step)

  def _lacks(self, label: str, step: int) -> bool:
    held = self._held[label]
    return step > min(held.get("train", -1), held.get("eval", -1))

  def _catch_up(self, label: str, reporter: Reporter, logged: list) -> None:
    """metrics.csv's rows up to the restored step (never trained again) that the tracker
    lacks (a SIGKILL came before they reached it, or a call failed), in order."""
    held = self._held[label]
    sent = False
    for at, split, values in logged:
      if at > held.get(split, -1):
        sent = self.write_to(label, reporter, at, split, values, record=False) or sent
    if sent:
      self._record()

  def rewind(self, step: int) -> None:
    for label, reporter in list(self._active):
      self._call(label, reporter, "rewind", reporter.rewind, step)

  def write(self, step: int, split: str, values: dict) -> None:
    if not values:
      return
    moved = False
    for label, reporter in list(self._active):
      if reporter.can_rewind:
        self._call(label, reporter, "write", reporter.write, step, split, values)
        continue
      moved = self.write_to(label, reporter, step, split, values, record=False) or moved
    if moved:
      self._record()

  def write_to(self, label: str, reporter: Reporter, step: int, split: str, values: dict, *,
               record: bool = True) -> bool:
    """Hands a tracker that cannot rewind a step it does not hold; True if it took it."""
    held = self._held.setdefault(label, {"run": reporter.run_id})
    if step <= held.get(split, -1):
      return False  # the tracker has this step already (logged before a kill or a rollback)
    if not self._call(label, reporter, "write", reporter.write, step, split, values, ok=True):
      return False
    held[split] = step
    if record:
      self._record()
    return True

  def _record(self) -> None:
    files.write_json(layout.reporters_path(self._model_dir), self._held,
                     what="the trackers' highest steps")

  def finish(self, summary: dict, export_dir: str | None) -> None:
    for label, reporter in list(self._active):
      self._call(label, reporter, "finish", reporter.finish, summary, export_dir)

  def close(self) -> None:
    for label, reporter in list(self._active):
      self._call(label, reporter, "close", reporter.close, grace_seconds=CLOSE_GRACE_SECONDS)
    self._active = []

  def _refused_on_failure(self, label: str, what: str, method, *args) -> None:
    try:
      if method.__self__.writes_model_dir:
        method(*args)
      else:
        preemption.bounded(method, *args, what=f"{label} {what}", limit_seconds=START_SECONDS,
                           grace_seconds=0)
    except (UserError, StorageError):
      raise
    except preemption.Abandoned as abandoned:
      if not abandoned.signalled:
        raise UserError(f"runtime.loggers: {label} did not {what} in {START_SECONDS:.0f} s") \
            from None
      logging.warning("runtime.loggers: %s's %s left unfinished (a signal arrived); %s "
                      "reports nothing", label, what, label)  # the run stops at its first boundary
      self._active = [(name, r) for name, r in self._active if r is not method.__self__]
    except Exception as error:  # pylint: disable=broad-except  (the user's, a client's)
      raise UserError(f"runtime.loggers: {label} cannot report ({what}: "
                      f"{type(error).__name__}: {_first_line(error)})") from None

  def _call(self, label: str, reporter: Reporter, what: str, method, *args, ok=False,
            grace_seconds: float = 0):
    """method(*args): its result (True with `ok`), or None after its one warning line, the
    reporter dropped. Model_dir's own writers are called directly: their StorageError
    is the run's."""
    if reporter.writes_model_dir:
      result = method(*args)
      return True if ok else result
    try:
      result = preemption.bounded(method, *args, what=f"{label} {what}",
                                  limit_seconds=CALL_SECONDS, grace_seconds=grace_seconds)
      return True if ok else result
    except preemption.Abandoned as abandoned:
      why = ("a signal arrived" if abandoned.signalled
             else f"no answer in {CALL_SECONDS:.0f} s")
      logging.warning("runtime.loggers: %s's %s left unfinished (%s); %s reports nothing "
                      "more, training goes on", label, what, why, label)
    except Exception as error:  # pylint: disable=broad-except  (a tracker never stops training)
      logging.warning("runtime.loggers: %s's %s failed (%s: %s); %s reports nothing more, "
                      "training goes on", label, what, type(error).__name__,
                      _first_line(error), label)
    self._active = [(name, r) for name, r in self._active if r is not reporter]
    return None


def _first_line(error: Exception) -> str:
  return (str(error).splitlines() or [""])[0][:200]


def build(config, model_dir: str, *, summaries, metrics_log, enabled: bool,
          read_only: bool) -> Reporters:
  """The run's reporters: `summaries` and `metrics_log` are the Trainer's (it reads them
  too); a run that only evaluates (`read_only`) reports to TensorBoard alone."""
  named = []
  for name in selected(config.runtime) if enabled else ():
    if name == "tensorboard":
      named.append((name, summaries))
    elif read_only:
      continue
    elif name == "csv":
      named.append((name, metrics_log))
    elif name == "mlflow":
      from trainer.reporters import mlflow_log  # pylint: disable=g-import-not-at-top
      named.append((name, mlflow_log.MlflowLog(config.runtime, model_dir)))
    elif name == "wandb":
      from trainer.reporters import wandb_log  # pylint: disable=g-import-not-at-top
      named.append((name, wandb_log.WandbLog(config.runtime, model_dir)))
    else:
      named.append((name, _users(name)))
  return Reporters(named, model_dir, enabled=enabled,
                   history=metrics_log if "csv" in selected(config.runtime) else None)


def _users(spec: str) -> Reporter:
  """A user's MODULE:CLASS, constructed with no arguments."""
  from trainer.setup import plugins  # pylint: disable=g-import-not-at-top
  made = plugins.call("runtime.loggers", spec, plugins.resolve("runtime.loggers", spec))
  if not isinstance(made, Reporter):
    raise UserError(f"runtime.loggers entry {spec!r} made a {type(made).__name__}, not a "
                    f"subclass of trainer.Reporter")
  return made
