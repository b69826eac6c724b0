"""The run's factor on its learning rate: train.lr_on_plateau, and an Action that sets it.

When either is on (the plateau's factor > 0, or an Action with sets_learning_rate=True),
every optimizer built by BuildContext.optimizer() runs on `schedule(step) * factor`
(trainer/task/optimizers.py `Factored`): the factor is one float32 variable of the run,
read by the compiled step, assigned here between loops. It is not a checkpointed
variable: the factor and the plateau's counters are JSON in each checkpoint's meta
(`train_state.action_state`, saved last at a boundary, after they changed), and the
restore of a step assigns the variable its factor again (`restored`, trainer/state/
train_state.py), so a resumed (or rolled back) run continues the same schedule bit for
bit. A signal's save at a step whose eval had not run yet records that (UNJUDGED): the
resumed run evaluates and judges that step before its first loop (boundary.py
`catch_up`). The Python float is the truth; the variable holds its float32.

Several workers: the decision's inputs (eval values) are the same on every worker, but
the factor is agreed anyway -- the chief's wins -- in one collective at the boundaries
where an action that may set it ran (the same boundaries on every worker).
"""
import math

from absl import logging

from trainer.errors import UserCodeError

FACTOR = "learning_rate"  # action_state[FACTOR] = {"factor": float}
PLATEAU = "lr_on_plateau"  # action_state[PLATEAU]: ReduceLROnPlateau's counters
# action_state[UNJUDGED] = step: saved by a signal before its eval (boundary.py catch_up).
UNJUDGED = "lr_on_plateau_unjudged_eval"


def wanted(config, user_actions) -> bool:
  """Whether the optimizers run on a factor: train.lr_on_plateau is on, or an Action
  declares sets_learning_rate=True."""
  return bool(config.train.lr_on_plateau.factor) or any(
      action.sets_learning_rate for action in user_actions)


def saved_factor(action_state: dict) -> float:
  """The factor a checkpoint's meta holds (1.0: none set yet)."""
  return float(action_state.get(FACTOR, {}).get("factor", 1.0))


def restored(variable):
  """`on_restore(action_state)` for TrainState: the restored step's factor into the
  variable the step reads (None: no factor in this run)."""
  if variable is None:
    return None
  return lambda action_state: variable.assign(saved_factor(action_state))


class LearningRateFactor:
  """The factor an Action reads and sets (`boundary.learning_rate_factor`,
  `boundary.set_learning_rate_factor`), kept in train_state.action_state."""

  def __init__(self, variable, train_state, agreement):
    self.variable = variable
    self._train_state = train_state
    self._agreement = agreement

  @property
  def factor(self) -> float:
    return saved_factor(self._train_state.action_state)

  def set(self, factor, who: str, step: int) -> None:
    if (isinstance(factor, bool) or not isinstance(factor, (int, float))
        or not math.isfinite(factor) or factor <= 0):
      raise UserCodeError(f"{who} set the learning rate factor to {factor!r} at step {step}: "
                          f"it must be a finite number > 0")
    self._train_state.action_state[FACTOR] = {"factor": float(factor)}

  def agree(self) -> None:
    """The chief's factor on every worker (one collective), into the variable."""
    _, factor = self._agreement.share(chiefs=self.factor)  # exact: a float64
    self._train_state.action_state[FACTOR] = {"factor": factor}
    self.variable.assign(factor)


class Plateau:
  """train.lr_on_plateau as an after_eval action: Keras's ReduceLROnPlateau
  (keras/src/callbacks/reduce_lr_on_plateau.py), its epochs our evals, its learning rate
  train.learning_rate * factor (min_lr bounds that, whatever train.lr_schedule does)."""

  def __init__(self, config, learning_rate: LearningRateFactor, train_state):
    self._config = config
    self._learning_rate = learning_rate
    self._train_state = train_state  # its action_state is replaced by each restore

  def __call__(self, boundary) -> None:
    settings, base = self._config.train.lr_on_plateau, self._config.train.learning_rate
    value = boundary.eval[settings.metric]
    state = self._train_state.action_state.setdefault(
        PLATEAU, {"best": None, "best_step": None, "wait": 0, "cooldown_counter": 0})
    if state["cooldown_counter"] > 0:
      state["cooldown_counter"] -= 1
      state["wait"] = 0
    best, delta = state["best"], settings.min_delta
    if best is None or (value < best - delta if settings.mode == "min"
                        else value > best + delta):
      state.update(best=value, best_step=boundary.step, wait=0)
      return
    if state["cooldown_counter"] > 0:
      return
    state["wait"] += 1
    if state["wait"] < settings.patience:
      return
    old = self._learning_rate.factor
    if base * old <= settings.min_lr:  # already at the floor: Keras changes nothing
      return
    new = max(old * settings.factor, settings.min_lr / base)
    self._learning_rate.set(new, "train.lr_on_plateau", boundary.step)
    logging.info("lr_on_plateau: %s %.4g not better than %.4g for %d evals at step %d: "
                 "learning rate factor %.6g -> %.6g", settings.metric, value, best,
                 state["wait"], boundary.step, old, new)
    state.update(cooldown_counter=settings.cooldown, wait=0)
