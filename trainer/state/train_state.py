"""The training state in and out of the model_dir: where training is (`Position`),
and the one object that restores, warm-starts and saves it (`TrainState`).

Why it lives apart from the loop: the controller (trainer/loop/controller.py)
decides *when* to save, restore or roll back; what a restore and a save must get
right, whatever the loop decides, is here:
- the agreed restore: steps are tried newest first and nothing is moved while
  looking; with several workers the chief names each step to try and all go on to
  the one before it unless every worker could read it (the same collectives run on
  every worker);
- each step's meta carries the run's identity (trainer/state/config_changes.py) and its
  run id (model_dir/run_id.json, written by `record_run`): a step of another run is
  refused (UserError) before anything is assigned or moved, even one whose fields are
  this run's (another run of the same config, another learning rate);
- a corrupt checkpoint (files deleted or truncated) is not a storage error: once an
  older step loads, the unreadable newer ones are set aside in checkpoints_corrupt/
  (kept, not deleted); none readable is refused unless checkpoint.if_unreadable=
  start_over; a permission or I/O error (StorageError) moves nothing;
- the warm start from checkpoint.init_from (weights only; with
  checkpoint.init_partial only those whose name and shape match, the rest listed);
- the guard on save: non-finite state never becomes a checkpoint.

It holds plain dicts of checkpoint key -> variable (the task's TaskState gives
them), so state/ needs nothing from the task or the loop. Only the chief writes.
"""
import copy
import dataclasses
import os
import time

from absl import logging
import ml_collections

from trainer.cluster.agreement import Agreement
from trainer.errors import NonFiniteError, StorageError, UserError
from trainer.state import checkpoints
from trainer.state import config_changes
from trainer.state import elastic
from trainer.state import keys
from trainer.store import model_dir as layout
from trainer.state import model_weights
from trainer.store import library_noise


_FAILED_READ_DRAIN_SECONDS = 1.0


@dataclasses.dataclass(frozen=True)
class Position:
  """Where training is: optimizer steps taken, and examples of the data stream used.

  `examples` is `step * global_batch_size` unless a rollback skipped batches or
  the batch size changed between runs; both are checkpointed, so a resumed run
  sees exactly the batches an uninterrupted one would have.
  """
  step: int
  examples: int

  def advance(self, num_steps: int, batch_size: int) -> "Position":
    return Position(self.step + num_steps, self.examples + num_steps * batch_size)


class TrainState:
  """The model and optimizer variables' checkpoints in one model_dir: restore, warm
  start, save, keep-best. `read_only` (eval, export) never writes or moves anything."""

  def __init__(self, config: ml_collections.ConfigDict, model_dir: str, *,
               model_variables: dict, optimizer_variables: dict, agreement: Agreement,
               is_chief: bool, read_only: bool, task_name: str = "", may_change=None,
               shape: dict | None = None, replica_dependence: list[str] = (),
               strategy_dependence: list[str] = (), on_restore=None):
    self._config = config
    # on_restore(action_state): what a restored step's action_state sets beyond the
    # variables (the learning rate factor: trainer/loop/learning_rate.py); None: nothing.
    self._on_restore = on_restore
    # The shape that trains (elastic.shape), recorded in each step's meta, and what makes
    # this task's trajectory depend on the replica count: an elastic resume is judged.
    self._shape = shape
    self._replica_dependence = list(replica_dependence)
    self._strategy_dependence = list(strategy_dependence)
    self._task_name = task_name  # 'module:Class' of the Task: part of each step's identity
    self._may_change = may_change  # the Task's own fields that do not fix the run
    self._model_variables = model_variables
    self._optimizer_variables = optimizer_variables
    self._agreement = agreement
    self._read_only = read_only
    self._model_dir = model_dir
    # This run's id, once the chief recorded it (record_run): what the steps it saves
    # name. Unset elsewhere: a restore compares with the model_dir's (run_id.json).
    self._run_id = None
    # What the built-in actions must carry across a resume (early stopping's patience),
    # JSON, saved in each checkpoint's meta and read back with its step.
    self.action_state: dict = {}
    writer = is_chief and not read_only
    self.checkpoints = checkpoints.Checkpoints(
        layout.checkpoint_dir(model_dir), max_to_keep=config.checkpoint.max_to_keep,
        keep_period=config.checkpoint.keep_period,
        async_save=config.checkpoint.async_save, writer=writer,
        mismatch_advice=layout.mismatch_advice(model_dir, training=not read_only))
    self._best_checkpoints = checkpoints.Checkpoints(
        layout.best_checkpoint_dir(model_dir), max_to_keep=config.checkpoint.keep_best,
        best_metric=config.checkpoint.best_metric, best_mode=config.checkpoint.best_mode,
        async_save=config.checkpoint.async_save,
        writer=writer) if config.checkpoint.keep_best else None

  # -- in ---------------------------------------------------------------------

  def restore_latest(self) -> Position | None:
    """Loads the newest readable checkpoint into the model and optimizer.

    Steps are tried newest first, and nothing is moved while looking: once one
    loads, the unreadable newer ones (files deleted or truncated) are set aside in
    checkpoints_corrupt/ with a warning. Checkpoints there but none readable:
    refused (UserError, exit 2, every byte left in place) unless
    checkpoint.if_unreadable=start_over (all set aside, None: step 0). A
    permission or I/O error is the storage's fault, never corruption: StorageError
    (exit 1), nothing moved. A step of another model is refused (exit 2).

    With several workers the chief's list of steps decides (a worker's list may be
    stale, or a step half-visible on shared storage): the chief names each step to
    try, every worker reads it, and all of them go on to the one before it unless
    every worker could. The same number of collectives runs on every worker.
    """
    self.checkpoints.wait()  # the chief's own pending save is a step to consider
    self.checkpoints.reload()
    unreadable = []  # (step, why), newest first
    step = self._agreement.chiefs(self._step_before(None))
    while step >= 0:
      position, problem = self._read(step)
      storage_failed = isinstance(problem, StorageError)
      if self._agreement.any(storage_failed):  # every worker stops, none moves anything
        raise problem if storage_failed else StorageError(
            f"cannot read checkpoint {step} in {self.checkpoints.directory} on another "
            f"worker (its log says why); nothing was moved or deleted")
      if self._agreement.all(position is not None):
        self._set_aside(unreadable, instead=f"step {step} restored instead")
        logging.info("Restored checkpoint at step %d from %s", step, self.checkpoints.directory)
        return position
      unreadable.append((step, problem or "unreadable on another worker"))
      step = self._agreement.chiefs(self._step_before(step))
    if unreadable:
      self._none_readable(unreadable)
    return None

  def restore(self, step: int) -> Position | None:
    """The position of `step` once loaded; None (with a warning) if its content is
    unreadable (nothing is moved); StorageError if the storage refuses the read."""
    position, problem = self._read(step)
    if isinstance(problem, StorageError):
      raise problem
    if problem is not None:
      logging.warning("Checkpoint %d is unreadable (%s).", step, problem)
    return position

  def warm_start(self) -> Position:
    """Weights (not optimizer state) from checkpoint.init_from, for a fresh model_dir;
    with checkpoint.init_partial only those whose name and shape match, the rest listed."""
    source = self._config.checkpoint.init_from
    if source:
      model_variables = self._model_variables
      loaded, item, skipped = model_weights.read_model_weights(
          source, checkpoints.variables_tree(model_variables),
          partial=self._config.checkpoint.init_partial)
      checkpoints.assign_tree({key: model_variables[key] for key in loaded}, loaded)
      if skipped:
        logging.warning("Warm start (checkpoint.init_partial): %d of %d variables from %s; "
                        "skipped %d, which start from their initializers: %s", len(loaded),
                        len(model_variables), item, len(skipped), "; ".join(skipped))
      logging.info("Warm start: weights from %s; optimizer state and step start fresh.", item)
    return Position(0, 0)

  def _step_before(self, step: int | None) -> int:
    """The newest checkpoint step below `step` (None: the newest of all); -1 if none."""
    earlier = [s for s in self.checkpoints.all_steps() if step is None or s < step]
    return earlier[-1] if earlier else -1

  def _read(self, step: int) -> tuple[Position | None, Exception | None]:
    """(position, None) once `step` is loaded, else (None, the CorruptCheckpoint or
    StorageError why not). Reads only: nothing on disk changes."""
    model_variables = self._model_variables
    optimizer_variables = self._optimizer_variables
    problem = None
    with library_noise.stderr_captured() as library_output:
      try:
        model_tree, optimizer_tree, meta = self.checkpoints.restore(
            step, checkpoints.variables_tree(model_variables),
            checkpoints.variables_tree(optimizer_variables))
      except (checkpoints.CorruptCheckpoint, StorageError) as e:
        # The failed read's pending tensorstore callbacks print asyncio
        # tracebacks to fd 2 from other threads for a moment: let them, unseen.
        library_output.discard()
        problem = e
        library_noise.after_failed_read(os.path.join(self.checkpoints.directory, str(step)))
        time.sleep(_FAILED_READ_DRAIN_SECONDS)
    if problem is not None:
      return None, problem
    # A step of another run (copied in, or config.json edited): refused, never set aside.
    where = os.path.join(self.checkpoints.directory, str(step))
    config_changes.check_step(meta, where, self._config.to_dict(), self._task_name,
                              self._keyed_shapes(), training=not self._read_only,
                              may_change=self._may_change)
    run, source = ((self._run_id, layout.run_id_path(self._model_dir)) if self._run_id
                   else config_changes.model_dir_run(self._model_dir))
    config_changes.check_run(meta, where, run, source)
    if not self._read_only and self._shape is not None:
      said = elastic.judge(meta.get("shape"), self._shape, step=step,
                           deterministic=self._config.runtime.deterministic,
                           dependence=self._replica_dependence,
                           allowed=self._config.checkpoint.allow_other_trajectory,
                           strategy_dependence=self._strategy_dependence)
      if said:
        logging.warning("%s", said)
    checkpoints.assign_tree(model_variables, model_tree)
    checkpoints.assign_tree(optimizer_variables, optimizer_tree)
    self.action_state = copy.deepcopy(meta.get("actions", {}))
    if self._on_restore is not None:
      self._on_restore(self.action_state)
    return Position(step, int(meta["examples_consumed"])), None

  def _set_aside(self, unreadable: list, *, instead: str) -> None:
    """Moves unreadable steps to checkpoints_corrupt/ (the chief; kept, not deleted)."""
    for step, why in unreadable:
      moved = self.checkpoints.set_aside(step)
      logging.warning("Checkpoint %d is unreadable (%s)%s; %s.", step, why,
                      f"; moved to {moved}" if moved else "", instead)

  def _none_readable(self, unreadable: list) -> None:
    """Checkpoints on disk, none readable: refuse, unless told to start over."""
    steps = ", ".join(str(step) for step, _ in unreadable)
    newest, why = unreadable[0]
    if self._config.checkpoint.if_unreadable != "start_over" or self._read_only:
      advice = ("" if self._read_only else
                "; or set checkpoint.if_unreadable=start_over to set them aside in "
                "checkpoints_corrupt/ and train from step 0")
      raise UserError(f"no checkpoint in {self.checkpoints.directory} can be read (step(s) "
                      f"{steps}; step {newest}: {why}); nothing was moved or deleted: repair "
                      f"or restore them, or use another --model_dir{advice}")
    self._set_aside(unreadable, instead="checkpoint.if_unreadable=start_over: training "
                                        "starts over from step 0")

  # -- out --------------------------------------------------------------------

  def record_run(self) -> str:
    """The chief, once every check that can refuse has passed (with config.json): this
    run's id, the model_dir's (run_id.json; without it, the one its steps name) or a new
    one (a fresh model_dir, a warm start, a model_dir written before run ids), written
    to run_id.json if it is not there. Every step saved from now on names it."""
    run, _ = config_changes.model_dir_run(self._model_dir)
    self._run_id = run or config_changes.new_run_id()
    if layout.read_run_id(self._model_dir) != self._run_id:
      layout.write_run_id(self._model_dir, self._run_id)
    return self._run_id

  def save(self, position: Position) -> bool:
    """Starts an async checkpoint of `position`; False (nothing done) if that step is
    the latest already. Refuses non-finite state (NonFiniteError)."""
    if self.checkpoints.latest_step() == position.step:
      return False
    self.checkpoints.save(position.step, *self._snapshot(position))
    return True

  def keep_best(self, position: Position, eval_metrics: dict) -> None:
    """checkpoint.keep_best: a copy of `position` among the best by
    checkpoint.best_metric in `eval_metrics` (off: nothing)."""
    if self._best_checkpoints is None:
      return
    if position.step in self._best_checkpoints.all_steps():
      # Evaluated again after a rollback (or a restart from an earlier step).
      logging.info("step %d is in %s already: kept as it is", position.step,
                   self._best_checkpoints.directory)
      return
    metric = self._config.checkpoint.best_metric
    self._best_checkpoints.save(position.step, *self._snapshot(position),
                                metrics={metric: eval_metrics[metric]})

  def _snapshot(self, position: Position) -> tuple[dict, dict, dict]:
    """Host copies of the state to save: model tree, optimizer tree, meta.

    The loop boundary has checked the state already (and rolled back if asked to);
    this is the last guard: non-finite state never becomes a checkpoint.
    """
    model_tree = checkpoints.variables_tree(self._model_variables)
    optimizer_tree = checkpoints.variables_tree(self._optimizer_variables)
    bad = checkpoints.non_finite_keys(model_tree) + checkpoints.non_finite_keys(optimizer_tree)
    if bad:
      raise NonFiniteError(f"non-finite values in {bad[0]} at step {position.step}; not saved "
                           f"({self.last_checkpoint_words()})")
    config_dict = self._config.to_dict()
    meta = {"step": position.step, "examples_consumed": position.examples,
            "config": config_dict, "actions": copy.deepcopy(self.action_state),
            "identity": config_changes.identity(config_dict, self._task_name,
                                                self._keyed_shapes(), self._run_id),
            "shape": self._shape,
            "dependence": elastic.dependence(
                deterministic=self._config.runtime.deterministic,
                replicas=self._replica_dependence, strategy=self._strategy_dependence)}
    return model_tree, optimizer_tree, meta

  def _keyed_shapes(self) -> dict:
    """'model/<key>' and 'optimizer/<key>' -> shape: what a step of this run holds."""
    return {key: tuple(variable.shape) for key, variable in
            keys.as_saved(self._model_variables, self._optimizer_variables).items()}

  # -- what is there --------------------------------------------------------------

  def wait(self) -> None:
    """Blocks until the pending saves are on disk."""
    self.checkpoints.wait()

  def latest_step(self) -> int | None:
    return self.checkpoints.latest_step()

  def all_steps(self) -> list[int]:
    return self.checkpoints.all_steps()

  def non_finite_keys(self) -> list[str]:
    """Checkpoint keys of the model and optimizer variables holding NaN or Inf."""
    return [f"{item}/{key}" for item, variables in
            (("model", self._model_variables), ("optimizer", self._optimizer_variables))
            for key in checkpoints.non_finite_keys(checkpoints.variables_tree(variables))]

  def last_checkpoint_words(self) -> str:
    """"the last checkpoint is step N" (or "no checkpoint yet"), for error messages."""
    step = self.latest_step()
    return "no checkpoint yet" if step is None else f"the last checkpoint is step {step}"

  def close(self) -> None:
    for manager in (self.checkpoints, self._best_checkpoints):
      if manager is not None:
        manager.wait()
        manager.close()
