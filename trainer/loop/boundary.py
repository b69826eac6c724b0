"""What runs at a loop boundary, between two compiled loops, and in which order.

distloop's own periodic work is made of Actions like a user's (trainer/loop/actions.py):
the progress line and TensorBoard's train scalars, the profile window, eval, keep-best,
early stopping and train.lr_on_plateau, then the user's Actions, then the checkpoint (by
steps, or by the chief's clock) last, so that a "save" decided before it saves this step.
The decisions ("stop", "save") and a signal that came while they ran are agreed by every
worker in one collective; a learning rate factor set there (trainer/loop/learning_rate.py)
in another, before the checkpoint saves it. A user's Action runs bounded, under the signal protocol
(`UserActionGuard`).

Why apart from the controller: the flow (trainer/loop/controller.py) says *that* the
boundary's work runs after each loop; this module says what that work is. It keeps no
position: the loop hands each boundary its own (`LoopBoundary`).
"""
import dataclasses
from typing import Callable

from absl import logging

from trainer.cluster import preemption
from trainer.errors import Preempted, StorageError, UserCodeHung
from trainer.loop import actions
from trainer.loop import learning_rate
from trainer.loop import profiling
from trainer.loop import progress
from trainer.setup import epochs
from trainer.state.train_state import Position
from trainer.task import user_code


@dataclasses.dataclass(frozen=True)
class Loop:
  """The loop that just ended: its steps, its seconds, the next step's learning rates."""
  steps: int
  seconds: float
  learning_rates: dict


@dataclasses.dataclass
class LoopBoundary(actions.Boundary):
  """A Boundary as the Trainer hands it to the Actions, with what distloop's own read (a
  user's Action is not promised them; they stay out of repr and comparisons): the loop's
  `position` (None where no loop of this process stands behind the boundary: before
  training, in eval and export modes), the `loop` that just ended (None at a phase), and
  the task's keyed `state` (trainer/state/task_state.py: what its checkpoints hold, which
  `python -m trainer.verify` digests at each boundary: trainer/loop/digests.py)."""
  position: Position | None = dataclasses.field(default=None, repr=False, compare=False)
  loop: Loop | None = dataclasses.field(default=None, repr=False, compare=False)
  state: object = dataclasses.field(default=None, repr=False, compare=False)


class BoundaryWork:
  """The run's Actions in the order they run at a boundary: distloop's own, the user's,
  the checkpoint last. The rest is the Trainer's, passed in: `evaluate(step, position)`,
  `save(position)`, `save_and_stop(position)` (the preemption save, then exit 42)."""

  def __init__(self, config, *, eval_interval: int, user_actions: list, evaluate: Callable,
               save: Callable, save_and_stop: Callable, progress_report: "ProgressReport",
               profiler: profiling.ProfileWindow, train_state, agreement, clock: Callable,
               learning_rate_factor=None):
    self._config = config
    self._evaluate = evaluate
    self._save_and_stop = save_and_stop
    self._progress_report = progress_report
    self._train_state = train_state
    self._agreement = agreement
    # Action.run restarts its timer as the save returns: checkpoint.interval_seconds
    # counts from the end of the latest save.
    self._checkpoint = actions.Action(
        lambda boundary: save(boundary.position), every_steps=config.checkpoint.interval,
        at_end=True, every_seconds=config.checkpoint.interval_seconds, name="checkpoint",
        clock=clock)
    early_stop = actions.Action(
        self._stop_if_no_better, after_eval=True,
        name="early_stop") if config.checkpoint.early_stop_patience else None
    # The run's learning rate factor (None: off): train.lr_on_plateau, a user's setter.
    self._learning_rate = learning_rate.LearningRateFactor(
        learning_rate_factor, train_state, agreement) if learning_rate_factor is not None else None
    self._plateau = plateau = actions.Action(
        learning_rate.Plateau(config, self._learning_rate, train_state), after_eval=True,
        name="lr_on_plateau",
        sets_learning_rate=True) if config.train.lr_on_plateau.factor else None
    self._eval = actions.Action(self._evaluate_at, every_steps=eval_interval, at_end=True,
                                name="eval")
    builtins = [
        actions.Action(progress_report.report, every_boundary=True, name="progress"),
        profiling.ProfileAction(profiler),
        self._eval,
        actions.Action(self._keep_if_best, after_eval=True, name="keep_best"),
        *([early_stop] if early_stop else []),
        *([plateau] if plateau else []),
    ]
    self.schedule = actions.Schedule([*builtins, *user_actions, self._checkpoint],
                                     config.train.steps)
    self.stop_reason = None  # a trainer.Stop's reason, where one stopped training
    # The actions whose decisions count (a built-in one decides nothing).
    self._deciding = {id(action) for action in [*user_actions, early_stop] if action}

  def run(self, boundary: LoopBoundary, clock_bits: int) -> str | None:
    """Runs the actions due at `boundary`, in order (`clock_bits`: the clocked ones due
    by the chief's clock); returns who stopped training here (an action's "stop", agreed
    by every worker: this worker's action that decided it, else
    actions.ANOTHER_WORKERS), None to go on."""
    position, schedule, checkpoint = boundary.position, self.schedule, self._checkpoint
    decided, reasons, user_ran, ran = {}, {}, False, set()
    for action in schedule.actions:
      if action is checkpoint:
        continue  # last, once the decisions are known
      if not action.due(position.step, schedule.last_step, evaluated=boundary.evaluated,
                        clock_due=schedule.clock_due(action, clock_bits)):
        continue
      ran.add(id(action))
      boundary.acting = (self._learning_rate, action)
      decision = action.run(boundary)
      if id(action) in self._deciding:
        user_ran = True
        if decision:
          decided.setdefault(actions.kind(decision), action.name)
          if isinstance(decision, actions.Stop):
            reasons.setdefault(action.name, decision.reason)
    stop = save = preempted = False
    if user_ran:  # the same boundaries on every worker: one collective, all decide alike
      # A stop asked while they ran (a signal, an Action's KeyboardInterrupt) is agreed
      # here too: this step is saved, not the next boundary's.
      stop, save, preempted = self._agreement.any_of_each(
          ["stop" in decided, "save" in decided, preemption.requested()])
    if preempted:
      self._save_and_stop(position)
    if stop:  # finish as at the last step: its at_end actions (the final eval first)
      boundary.final = True
      for action in schedule.due_when_stopping(boundary, ran, last=checkpoint):
        ran.add(id(action))
        boundary.acting = (self._learning_rate, action)
        action.run(boundary)  # a decision changes nothing now: this step is saved, the end
    if self._learning_rate is not None and any(  # the same boundaries on every worker
        action.sets_learning_rate for action in schedule.actions if id(action) in ran):
      self._learning_rate.agree()  # the chief's factor, saved by the checkpoint below
    clock_due = schedule.clock_due(checkpoint, clock_bits)
    if clock_due and not checkpoint.due(position.step, schedule.last_step, evaluated=False,
                                        clock_due=False):
      logging.info("checkpoint.interval_seconds passed on the chief's clock: saving step %d",
                   position.step)
    if stop or save or checkpoint.due(position.step, schedule.last_step, evaluated=False,
                                      clock_due=clock_due):
      checkpoint.run(boundary)
    if not stop:
      return None
    self.stop_reason = reasons.get(decided.get("stop"))
    logging.info("%s%s", actions.stop_line(decided.get("stop"), position.step),
                 f" ({self.stop_reason})" if self.stop_reason else "")
    return decided.get("stop", actions.ANOTHER_WORKERS)

  def preempted(self, boundary: LoopBoundary) -> None:
    """A stop agreed right after a loop: the loop's train values logged first
    (metrics.csv, TensorBoard: the progress action), then its step saved and Preempted
    (exit 42). The run resumed from this step logs from the next loop on: a row not
    logged now is never logged (issue 57)."""
    if self._plateau is not None and self._eval.due(boundary.step, self.schedule.last_step,
                                                    evaluated=False, clock_due=False):
      # Its eval does not run (the signal's save comes first): the resumed run's does.
      self._train_state.action_state[learning_rate.UNJUDGED] = boundary.step
    self._progress_report.report(boundary)
    self._save_and_stop(boundary.position)

  def catch_up(self, boundary: LoopBoundary) -> None:
    """Before the first loop of a run resumed at a step a signal saved before its eval
    ran (`preempted`): train.lr_on_plateau's eval and judgment of that step, as the
    uninterrupted run made them (the same weights: the step's), so the resumed run goes on
    at the factor the uninterrupted one did. Every worker restored the same record."""
    if (self._train_state.action_state.pop(learning_rate.UNJUDGED, None) != boundary.step
        or self._plateau is None):
      return
    self._evaluate_at(boundary)
    boundary.acting = (self._learning_rate, self._plateau)
    self._plateau.run(boundary)
    self._learning_rate.agree()

  def _evaluate_at(self, boundary: LoopBoundary) -> None:
    boundary.eval = self._evaluate(boundary.step, boundary.position)
    boundary.evaluated = True

  def _keep_if_best(self, boundary: LoopBoundary) -> None:
    self._train_state.keep_best(boundary.position, boundary.eval)

  def _stop_if_no_better(self, boundary: LoopBoundary) -> str | None:
    """checkpoint.early_stop_patience: "stop" once checkpoint.best_metric has not beaten
    its best by early_stop_min_delta for that many evals in a row. The count lives in
    the checkpoints (train_state.action_state): a resumed run goes on counting."""
    settings = self._config.checkpoint
    value = boundary.eval[settings.best_metric]
    state = self._train_state.action_state.setdefault(
        "early_stop", {"best": None, "best_step": None, "evals_since": 0})
    best, delta = state["best"], settings.early_stop_min_delta
    if best is None or (value < best - delta if settings.best_mode == "min"
                        else value > best + delta):
      state.update(best=value, best_step=boundary.step, evals_since=0)
      return None
    state["evals_since"] += 1
    logging.info("early stop: %s %.4f at step %d is no better than %.4f (step %d), %d of %d "
                 "evals", settings.best_metric, value, boundary.step, best, state["best_step"],
                 state["evals_since"], settings.early_stop_patience)
    return "stop" if state["evals_since"] >= settings.early_stop_patience else None


class ProgressReport:
  """The progress line and the train values of the loop that just ended (the "progress"
  action); `log_metrics(step, split, values)`: every reporter (trainer/reporters/)."""

  def __init__(self, config, train_sums, *, epoch_size: int | None, log_metrics: Callable):
    self._config = config
    self._sums = train_sums
    self._shown = [name for name in train_sums.names if name != "regularization_loss"]
    self._epoch_size = epoch_size  # None: a tf.data stream
    self._log_metrics = log_metrics

  def report(self, boundary: LoopBoundary) -> None:
    step, metrics, loop = boundary.step, boundary.train, boundary.loop
    examples_per_sec = loop.steps * self._config.train.global_batch_size / loop.seconds
    epoch = epochs.epoch(boundary.position.examples, self._epoch_size)
    reported = {
        **({"epoch": epoch} if epoch is not None else {}),
        **{name: metrics[name] for name in self._sums.names},
        **loop.learning_rates, "examples_per_sec": examples_per_sec,
        "steps_per_sec": loop.steps / loop.seconds,
        **{name: metrics[name] for name in self._sums.norm_names if name in metrics}}
    self._log_metrics(step, "train", reported)
    rates = " ".join(f"{rate:.3g}" for rate in loop.learning_rates.values())
    total = self._config.train.steps
    progress.show(step, total,
                  ("" if epoch is None else f"epoch {epoch:.2f} | ") +
                  f"{metrics_line(metrics, self._shown)} | lr {rates} | "
                  f"{examples_per_sec:.0f} examples/s | "
                  f"ETA {_eta(total - step, loop.seconds / loop.steps)}")


class UserActionGuard:
  """How a user's Action runs (its `guard`): bounded (trainer/cluster/preemption.py), left
  running after a signal (its boundary's step saved, exit 42) or past
  train.action_timeout_seconds (exit 1). It cannot end the process behind the run's back
  either: sys.exit is a failure (its step saved, exit 1), KeyboardInterrupt a stop as on
  SIGINT (saved, exit 42). `save(position)`: the Trainer's; `saves_alone`: a save needs
  no other worker (one worker, or parameter_server's coordinator)."""

  def __init__(self, config, *, save: Callable, train_state, read_only: bool,
               saves_alone: bool):
    self._config = config
    self._save = save
    self._train_state = train_state
    self._read_only = read_only
    self._saves_alone = saves_alone

  def __call__(self, action: actions.Action, boundary: LoopBoundary) -> str | None:
    limit = self._config.train.action_timeout_seconds
    try:
      return preemption.bounded(action.function, boundary, what=f"action {action.name!r}",
                                limit_seconds=limit,
                                grace_seconds=user_code.SIGNAL_GRACE_SECONDS)
    except SystemExit as exited:
      on_disk, unsaved = self._save_boundary_step(boundary)
      if unsaved:
        logging.warning("step %d, where %s called sys.exit, could not be saved: %s",
                        boundary.step, action.name, unsaved)
      raise user_code.action_exited(action.name, boundary.step, exited,
                                    saved=on_disk == boundary.step) from None
    except KeyboardInterrupt as interrupt:  # a stop, agreed after the boundary's actions
      preemption.request(f"action {action.name!r} raised KeyboardInterrupt at step "
                         f"{boundary.step}{user_code.location(interrupt)}")
      return None
    except preemption.Abandoned as abandoned:
      on_disk, unsaved = self._save_boundary_step(boundary)
      if abandoned.signalled:
        logging.warning("%s at step %d did not return within %.0f s of the signal: left "
                        "running", abandoned.what, boundary.step, user_code.SIGNAL_GRACE_SECONDS)
        if unsaved:
          raise Preempted(boundary.step, unsaved=unsaved, last_complete=on_disk) from None
        raise Preempted(on_disk) from None
      disk = (f"step {on_disk} is saved" if on_disk == boundary.step and not unsaved else
              f"the last checkpoint (step {on_disk}) is intact" if on_disk is not None else
              "no checkpoint yet")
      raise UserCodeHung(f"{abandoned.what} did not return within {limit:g} s at step "
                         f"{boundary.step} (train.action_timeout_seconds): {disk}; ended the "
                         f"run with it still running") from None


  def _save_boundary_step(self, boundary: LoopBoundary) -> tuple[int | None, str]:
    """Saves the step of `boundary` (where a user's Action ended the run) when it is
    the loop's current step and not on disk yet; returns (the latest step on disk, why
    `boundary`'s could not be saved, or "")."""
    position = boundary.position
    on_disk, unsaved = self._train_state.latest_step(), ""
    if (position is not None and position.step == boundary.step and not self._read_only
        and position.step != on_disk):
      if self._saves_alone:
        try:  # the weights are the boundary's: the Action runs after the loop
          self._save(position)
          self._train_state.wait()
          on_disk = position.step
        except StorageError as e:
          unsaved = str(e)
      else:  # a save is a collective: the other workers may be elsewhere
        unsaved = "other workers may be inside the Action: no agreed save"
    return on_disk, unsaved


def metrics_line(values: dict, names) -> str:
  """`name value | ...` of the progress and eval lines."""
  return " | ".join(f"{name} {values[name]:.4f}" for name in names)


def _eta(remaining_steps: int, seconds_per_step: float) -> str:
  seconds = int(remaining_steps * seconds_per_step)
  return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
