"""Actions: code at loop boundaries, *when* kept apart from *what*.

An Action is a function and a rule saying when it is due:

    every_steps=N     at every multiple of N (the loop stops there: the boundary exists)
    every_seconds=T   once T seconds passed since it last ran (the chief's clock decides
                      for every worker: clocks differ)
    after_eval=True   at a boundary where an eval just ran (early stopping, keep-best)
    at_end=True       at the final step, or where the run stops early (an action's
                      "stop", early stopping); not when preempted (exit 42) or failing
    every_boundary    at every loop boundary (train.steps_per_loop)
    phase="..."       at a phase of the run rather than a boundary: "restored" (after
                      the restore, before training), "eval" (as an eval starts),
                      "export" (before the SavedModel is written), "summary" (before
                      summary.json is written)

It is called with a `Boundary` (the step, the latest train and eval metrics, the
model_dir, whether this process is the chief, the task) and may return a decision
for the whole job: "stop" (save this step, then end training as if it were the
last: the at_end actions and the final eval, export, exit 0; `Stop(reason)`: a "stop"
that says why) or "save" (checkpoint this step now). An action at a phase cannot decide: a decision there is refused. A decision
is agreed across workers (any worker deciding decides for all), so every worker
acts at the same step. Every worker runs every action (write files on the chief
only: `boundary.is_chief`). One made with sets_learning_rate=True may also set the run's
learning rate factor (`boundary.set_learning_rate_factor`: trainer/loop/learning_rate.py).

A user's Action runs in a thread of its own while the main thread keeps the signal
protocol (trainer/task/user_code.py `bounded`): one that blocks cannot keep the job
from ending. A signal ends it within seconds (the boundary's step saved, exit 42);
one that has not returned after train.action_timeout_seconds ends the run (exit 1),
in one line naming it and the step. Nor can it end the process: sys.exit there is a
failure (its step saved, one line, exit 1), KeyboardInterrupt a stop as on SIGINT
(its step saved, exit 42): trainer/loop/boundary.py `UserActionGuard`.

distloop's own periodic work -- the progress line and TensorBoard, eval, keep-best,
the checkpoint by steps and by clock, the profile window -- is made of the same
Actions (trainer/loop/boundary.py, `BoundaryWork`). User actions come from
`train.actions` (MODULE:FUNCTION entries, each `FUNCTION(config)` returning an
Action or a list of them) or from `trainer.run(..., actions=[...])`.
"""
import dataclasses
import time
from typing import Any, Callable

from trainer.loop import periodic
from trainer.task import user_code
from trainer.errors import UserCodeError, UserError

DECISIONS = ("stop", "save")
PHASES = ("restored", "eval", "export", "summary")
# Who stopped the run (summary.json's stopped_early_by) on a worker whose own actions did not
# decide "stop": the decision was agreed from another's.
ANOTHER_WORKERS = "an action on another worker"


@dataclasses.dataclass(frozen=True)
class Stop:
  """An Action's "stop" that says why: `return trainer.Stop("pruned by Optuna's
  MedianPruner")` stops as "stop" does, and the reason is recorded with the Action's
  name (finished.json's reason, summary.json's stop_reason, the log line)."""
  reason: str

  def __post_init__(self):
    if not isinstance(self.reason, str) or not self.reason.strip():
      raise UserError(f"trainer.Stop(reason) takes a non-empty string, not {self.reason!r}")


def kind(decision) -> str | None:
  """"stop", "save" or None: what a decision asks, a Stop being a "stop"."""
  return "stop" if isinstance(decision, Stop) else decision


def stop_line(decided_by: str | None, step: int) -> str:
  """The log line of an agreed "stop" at `step`: `decided_by` is the name of this worker's
  action that decided it, None where only another worker's did."""
  who = f"action {decided_by}" if decided_by else ANOTHER_WORKERS
  return f"{who} decided to stop at step {step}: saved; finishing as at the last step"


@dataclasses.dataclass
class Boundary:
  """What an action sees. `train`: the metrics of the loop that just ended (means over
  its steps); `eval`: the latest eval's (None before the first); `evaluated`: an eval
  ran at this step; `final`: training ends at this step (the last, or a "stop")."""
  step: int
  train: dict
  eval: dict | None
  evaluated: bool
  model_dir: str
  is_chief: bool
  task: Any
  final: bool = False
  # (the run's LearningRateFactor or None, the Action running): the Trainer's, per action.
  acting: tuple | None = dataclasses.field(default=None, repr=False, compare=False)

  @property
  def learning_rate_factor(self) -> float:
    """The factor on the run's learning rate (train.lr_schedule(step) * factor, every
    optimizer BuildContext.optimizer() built): 1.0 unless train.lr_on_plateau or an
    Action changed it."""
    learning_rate = self.acting[0] if self.acting else None
    return learning_rate.factor if learning_rate is not None else 1.0

  def set_learning_rate_factor(self, factor: float) -> None:
    """From the next step on the learning rate is schedule(step) * `factor` (> 0), on
    every worker (the chief's value wins), saved with each checkpoint. Only an Action
    made with sets_learning_rate=True may call it."""
    learning_rate, action = self.acting or (None, None)
    if action is None or not action.sets_learning_rate or learning_rate is None:
      name = f"action {action.name!r}" if action is not None else "an action"
      raise UserCodeError(f"{name} called boundary.set_learning_rate_factor({factor!r}) at "
                          f"step {self.step} without declaring it: make it "
                          f"trainer.Action(..., sets_learning_rate=True)")
    learning_rate.set(factor, f"action {action.name!r}", self.step)


class Action:
  """`function(boundary) -> None | "stop" | "save"`, due by its rule (module docstring)."""

  def __init__(self, function: Callable, *, every_steps: int = 0, every_seconds: float = 0.0,
               after_eval: bool = False, at_end: bool = False, every_boundary: bool = False,
               phase: str | None = None, name: str | None = None,
               clock: Callable[[], float] = time.monotonic, sets_learning_rate: bool = False):
    if not callable(function):
      raise UserError(f"an Action's function must be callable, not {type(function).__name__}")
    if phase is not None and phase not in PHASES:
      raise UserError(f"Action phase={phase!r} is not one of {', '.join(PHASES)}")
    if every_steps < 0 or every_seconds < 0:
      raise UserError("an Action's every_steps and every_seconds must be >= 0")
    if not (every_steps or every_seconds or after_eval or at_end or every_boundary or phase):
      raise UserError(f"Action {name or getattr(function, '__name__', function)!r} is never "
                      f"due: give every_steps, every_seconds, after_eval, at_end, "
                      f"every_boundary or phase")
    if sets_learning_rate and phase is not None:
      raise UserError(f"Action phase={phase!r} cannot set the learning rate: only an action "
                      f"due at a loop boundary may (sets_learning_rate=True)")
    self.function = function
    # It may call boundary.set_learning_rate_factor (trainer/loop/learning_rate.py).
    self.sets_learning_rate = sets_learning_rate
    self.every_steps = every_steps
    self.after_eval = after_eval
    self.at_end = at_end
    self.every_boundary = every_boundary
    self.phase = phase
    self.name = name or getattr(function, "__name__", type(function).__name__)
    self.timer = periodic.AfterSeconds(every_seconds, clock) if every_seconds else None
    # guard(action, boundary) -> decision: how the Trainer runs a user's function (under
    # the signal protocol and train.action_timeout_seconds); None: called directly.
    self.guard = None

  def next_step(self, step: int, last_step: int) -> int:
    """The next step after `step` at which a boundary must exist for this action."""
    if self.every_steps:
      return periodic.Every(self.every_steps, last_step).next_due(step)
    return last_step

  def due(self, step: int, last_step: int, *, evaluated: bool, clock_due: bool) -> bool:
    if self.phase is not None:
      return False
    return (self.every_boundary or (self.every_steps and step % self.every_steps == 0)
            or (self.at_end and step == last_step) or (self.after_eval and evaluated)
            or clock_due)

  def run(self, boundary: Boundary) -> str | None:
    try:
      decision = self.guard(self, boundary) if self.guard else self.function(boundary)
    except Exception as error:  # pylint: disable=broad-except  (one line if the user's)
      user_code.action_failed(self.name, boundary.step, error)
    if self.timer is not None:
      self.timer.restart()
    if decision is not None and kind(decision) not in DECISIONS:
      raise UserError(f"action {self.name!r} returned {decision!r}; an action returns None, "
                      f"'stop', trainer.Stop(reason) or 'save'")
    return decision

  def __repr__(self):
    return f"Action({self.name})"


def resolve(specs: str, config) -> list[Action]:
  """train.actions: comma-separated MODULE:FUNCTION, each FUNCTION(config) -> Action(s)."""
  from trainer.setup import plugins  # pylint: disable=g-import-not-at-top
  found = []
  for spec in [part.strip() for part in (specs or "").split(",") if part.strip()]:
    factory = plugins.resolve("train.actions", spec)
    made = plugins.call("train.actions", spec, factory, config)
    made = made if isinstance(made, (list, tuple)) else [made]
    for action in made:
      if not isinstance(action, Action):
        raise UserError(f"train.actions entry {spec!r} returned {type(action).__name__}, not a "
                        f"trainer.Action")
      found.append(action)
  return found


def checked(given) -> list[Action]:
  """trainer.run(..., actions=[...]): each a trainer.Action (UserError otherwise)."""
  for action in given:
    if not isinstance(action, Action):
      raise UserError(f"trainer.run(actions=...) holds a {type(action).__name__}, not a "
                      f"trainer.Action")
  return list(given)


class Schedule:
  """The run's actions in order; what is due at a boundary, and the next boundary."""

  def __init__(self, actions: list[Action], last_step: int):
    self.actions = list(actions)
    self.last_step = last_step
    self._clocked = [a for a in self.actions if a.timer is not None]

  def steps_to_next(self, step: int) -> int:
    return min(a.next_step(step, self.last_step) for a in self.actions
               if a.phase is None) - step

  def clock_bits(self) -> int:
    """Which clocked actions are due by this process's clock, as bits (the chief's win)."""
    return sum(1 << i for i, a in enumerate(self._clocked) if a.timer.due())

  def clock_due(self, action: Action, bits: int) -> bool:
    return action.timer is not None and bool(bits >> self._clocked.index(action) & 1)

  def restart_clocks(self) -> None:
    for action in self._clocked:
      action.timer.restart()

  def at_phase(self, phase: str, boundary: Boundary) -> None:
    """Runs the actions of `phase`; a decision there is refused (UserCodeError): a phase
    is not a loop boundary, so neither "stop" nor "save" could be honoured."""
    for action in self.actions:
      if action.phase == phase:
        decision = action.run(boundary)
        if decision is not None:
          raise UserCodeError(
              f"action {action.name!r} (phase={phase!r}) returned {decision!r} at step "
              f"{boundary.step}, which a phase cannot honour: only an action due at a loop "
              f"boundary (every_steps, every_seconds, after_eval, at_end, every_boundary) "
              f"may return 'stop' or 'save'")

  def due_when_stopping(self, boundary: Boundary, ran: set, last: Action):
    """At a boundary where the run stops early ("stop", early stopping), the actions it
    would have run had it been the last step, and has not run yet: at_end ones (the
    final eval among them), then after_eval ones once that eval ran; `last` (the
    checkpoint) excepted. Lazily: an eval run here makes the after_eval ones due."""
    for action in self.actions:
      if action is not last and id(action) not in ran and action.due(
          boundary.step, boundary.step, evaluated=boundary.evaluated, clock_due=False):
        yield action
