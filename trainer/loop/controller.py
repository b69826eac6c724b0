"""The training flow, top to bottom: `Trainer.train()`.

Who owns what: the Trainer decides *when* (the loop, its boundaries and the
Actions due there: trainer/loop/actions.py), and the policies around the step:
stop or roll back on non-finite values, save on a signal, what eval and export
report; the Task says *what* one step does (trainer/task/: the user's, or the
built-in supervised one); trainer/loop/steps.py owns what runs compiled;
trainer/state/train_state.py owns how the state gets in and out (the agreed
restore, set-aside, warm start, the guarded save), the rest of trainer/state/ the
disk; input_pipelines owns the data order (a pure function of seed and position);
trainer/cluster/ owns signals and the decisions every worker shares. Only the
chief writes.

Here: the flow (train), eval, the saves, export. Beside it in trainer/loop/: what the
flow runs, assembled before it begins (assembly.py); the training batches from a
position (batches.py); the work at a loop boundary, distloop's own Actions and the
user's (boundary.py); what a loop's values can stop: rollback (value_checks.py); the
weights eval and export see (serving.py); what the run has done so far, and summary.json
(run_record.py). The position travels as a value: passed and returned, never kept for
another method to find.
"""
import contextlib
import functools
import math
import time
from typing import Callable

from absl import logging
import ml_collections
import tensorflow as tf

from input_pipelines.errors import DataError
from input_pipelines.sources import Source
from trainer.cluster import preemption
from trainer.cluster import runtime
from trainer.cluster.agreement import Agreement
from trainer.errors import Preempted, StorageError
from trainer.loop import actions as actions_module
from trainer.loop import assembly
from trainer.loop import digests
from trainer.reporters import fan_out
from trainer.reporters import metrics_log
from trainer.loop import profiling
from trainer.loop import progress
from trainer.reporters import summaries
from trainer.loop import value_checks
from trainer.loop.batches import TrainBatches, dropped_off_the_main_thread
from trainer.loop.learning_rate import wanted as factored
from trainer.loop.boundary import (BoundaryWork, Loop, LoopBoundary, ProgressReport,
                                   UserActionGuard, metrics_line)
from trainer.loop.run_record import RunRecord, Trained
from trainer.loop.serving import Serving
from trainer.setup import epochs
from trainer.store import files
from trainer.store import model_dir as layout
from trainer.state.train_state import Position
from trainer.task import user_code


class Trainer:
  """Trains, evaluates and exports one model in one model_dir.

      position = newest readable checkpoint (weights, optimizer, step, data
                 position), else a warm start from checkpoint.init_from, else 0
      batches = the global batch sequence from that position on
      while step < train.steps:
          n = steps to the next boundary: steps_per_loop, checkpoint, eval or the end
          train_loop(batches, n)          # compiled: n steps, no Python in between
          read metrics once (host sync); on NaN/Inf: stop, or roll back and skip ahead
          log; TensorBoard
          SIGTERM/SIGINT/SIGHUP agreed by all workers -> save this step, wait, exit 42
          evaluate if due (and keep the best)
          checkpoint if due by steps, or by the chief's clock (async)
      wait for saves; final eval; export; summary.json; finished.json (what waiters read)
      (a signal agreed right after the restore, or before the final eval or the
       export, also exits 42: the step is on disk; see trainer/cluster/preemption.py)

  Constructing a Trainer builds the model and optimizer under the strategy;
  it reads and writes nothing. `read_only` (eval, export) never writes checkpoints.
  """

  def __init__(self, config: ml_collections.ConfigDict, model_dir: str,
               strategy: tf.distribute.Strategy, splits: tuple[Source, Source], *,
               task=None, actions=(), read_only: bool = False,
               clock: Callable[[], float] = time.monotonic, epoch_plan=None):
    self.config = config
    self.model_dir = model_dir
    self.strategy = strategy
    self.train_source, self.eval_source = splits
    self._read_only = read_only
    self._clock = clock
    # train.epochs (trainer/setup/epochs.py): config.train.steps were derived from the newest
    # checkpoint's data position; the one restored must make the same steps.
    self._epoch_plan = epoch_plan
    self._user_actions = [*actions_module.resolve(config.train.actions, config),
                          *actions_module.checked(actions),
                          *digests.requested()]  # python -m trainer.verify's digests
    # The user's actions at the run's phases (restored, eval, export, summary).
    self._phases = actions_module.Schedule(self._user_actions, config.train.steps)
    self._batches = TrainBatches(config, self.train_source)  # data.preprocess checked
    # A few real training examples: the task's input spec, the start-up checks, samples.
    self._probe, self.features_spec, labels_spec = self._batches.probe()
    self.is_chief = runtime.is_chief(strategy)
    self.agreement = Agreement(strategy)
    # parameter_server: this process is the coordinator; it schedules steps on the workers.
    self.coordinator = runtime.coordinator(strategy)

    # What the flow runs (trainer/loop/assembly.py): the task built, its steps traced,
    # the train loop compiled.
    self.task = assembly.create_task(config, task)
    built = assembly.assemble(config, strategy, self.coordinator, self.task, splits, self._probe,
                              self.features_spec, labels_spec,
                              preprocessed=self._batches.preprocess is not None,
                              read_only=read_only, factored=factored(config, self._user_actions))
    self.state = built.state  # the task's variables; self.train_state: their checkpoints
    self._train_sums, self._eval_sums = built.train_sums, built.eval_sums
    self._train_loop, self._device_decode = built.train_loop, built.device_decode
    self._on_accelerator = built.on_accelerator
    # Built on first use (a training run that never evaluates distributes no eval data),
    # then the same pass each time.
    self._eval_pass = functools.cache(lambda: assembly.eval_pass(
        config, strategy, self.coordinator, self.task, self._eval_sums, self.eval_source,
        on_accelerator=self._on_accelerator))
    self.train_state = assembly.train_state(config, model_dir, self.task, self.state, strategy,
                                            agreement=self.agreement, is_chief=self.is_chief,
                                            read_only=read_only)
    self.checkpoints = self.train_state.checkpoints  # continuous_eval and the api read it
    # What the run reports (runtime.loggers: trainer/reporters/), on the chief.
    loggers = fan_out.selected(config.runtime)
    self.summaries = summaries.Summaries(model_dir, enabled=self.is_chief and
                                         "tensorboard" in loggers)
    self.metrics_log = metrics_log.MetricsLog(
        model_dir, enabled=self.is_chief and not read_only and "csv" in loggers)
    self.reporters = fan_out.build(config, model_dir, summaries=self.summaries,
                                   metrics_log=self.metrics_log, enabled=self.is_chief,
                                   read_only=read_only)
    self.profiler = profiling.ProfileWindow(config.runtime.profile_steps, self.summaries.root,
                                            trace=self.is_chief)

    # The policies around the step, each in its module.
    guard = UserActionGuard(config, save=self.save, train_state=self.train_state,
                            read_only=read_only, saves_alone=bool(self.coordinator) or
                            runtime.num_workers(strategy) == 1)
    for action in self._user_actions:  # a blocked Action cannot keep the job from ending
      action.guard = guard
    self.serving = Serving(config, self.task, self.state, model_dir=model_dir,
                           is_chief=self.is_chief, features_spec=self.features_spec,
                           feature_name=self.train_source.feature_name,
                           probe_features=self._probe[0])
    self._rollbacks = value_checks.Rollbacks(config, self.train_state, reporters=self.reporters)
    self._progress = ProgressReport(config, self._train_sums,
                                    epoch_size=epochs.num_examples(self.train_source),
                                    log_metrics=self.reporters.write)

    self.run = RunRecord()  # what the run has done so far (trainer/loop/run_record.py)

  # -- the flow ---------------------------------------------------------------

  def train(self, *, eval_interval: int) -> dict:
    """Trains to train.steps, evaluating every `eval_interval` steps (0: at the end only)."""
    started = time.perf_counter()
    self.serving.served()  # an export that cannot be made is refused now, not after training
    # Refuses another model's checkpoints (and a tracker that cannot be reached) before
    # anything is written or moved.
    self.reporters.check()
    position = self.train_state.restore_latest() or self.train_state.warm_start()
    if self._epoch_plan is not None:  # the same on every worker: the same config
      self._epoch_plan.check_restored(position.step, position.examples, self.config.train.steps,
                                      any_worker=self.agreement.any)
    self.run.started_at, self.run.eval_metrics = position.step, None
    watcher = preemption.PreemptionWatcher(self.agreement)
    boundaries = BoundaryWork(
        self.config, eval_interval=eval_interval, user_actions=self._user_actions,
        evaluate=self.evaluate, save=self.save, save_and_stop=self._save_and_stop,
        progress_report=self._progress, profiler=self.profiler, train_state=self.train_state,
        agreement=self.agreement, clock=self._clock,
        learning_rate_factor=self.state.learning_rate_factor)
    self._phases.at_phase("restored", self._boundary(position.step, {}))  # no loop behind it
    if watcher.stop_agreed():  # signalled during start-up or restore: nothing new to save
      raise Preempted(position.step if self.train_state.latest_step() is not None else None)
    self._begin(position)
    boundaries.catch_up(self._boundary(position.step, {}, position))  # lr_on_plateau's eval
    with watcher, contextlib.closing(self.profiler):
      trained = self._train_loops(position, boundaries)
    return self._end_of_run(trained, watcher, started)

  def _train_loops(self, position: Position, boundaries: BoundaryWork) -> Trained:
    """Compiled loops from `position` to train.steps (or an Action's stop), each followed
    by its boundary's work: the values logged, a signal agreed, eval, checkpoint, the
    Actions due. A loop with non-finite values is rolled back (value_checks.py)."""
    config = self.config
    total, batch_size = config.train.steps, config.train.global_batch_size
    throughput = progress.Throughput()
    train_metrics = {}
    record_graph = position.step == 0 and self.coordinator is None  # the step graph, once
    batches = self._batches_from(position)
    boundaries.schedule.restart_clocks()
    self.profiler.at_boundary(position.step)
    stopped_by = None
    while position.step < total and stopped_by is None:
      num_steps = min(config.train.steps_per_loop, total - position.step,
                      boundaries.schedule.steps_to_next(position.step))
      loop_start = time.perf_counter()
      with self.profiler.step(position.step + 1), (
          self.summaries.graph_of_first_call(position.step) if record_graph
          else contextlib.nullcontext()), user_code.running(
                f"{type(self.task).__name__}.train_step",
                f"in steps {position.step + 1}..{position.step + num_steps}"):
        state_finite, totals, learning_rates = self._train_loop(
            batches, tf.constant(num_steps), tf.constant(position.step, tf.int64))
      record_graph = False
      train_metrics = self._train_sums.result(totals)  # host sync: the n steps
      value_checks.refuse_replica_dependent(self.task, self.strategy.num_replicas_in_sync,
                                            self._train_sums.disagreeing(totals),
                                            position.step, num_steps)
      loop_seconds = time.perf_counter() - loop_start
      reached = position.advance(num_steps, batch_size)
      non_finite = [name for name in self._train_sums.names
                    if not math.isfinite(train_metrics[name])]
      if non_finite or not bool(state_finite):
        position = self._rollbacks.roll_back(position, reached, non_finite, train_metrics)
        batches = self._batches_from(position)
        continue
      position = reached
      throughput.add(num_steps * batch_size, loop_seconds)
      loop = Loop(num_steps, loop_seconds,
                  self.state.learning_rates(learning_rates))  # the next step's rates
      # One collective: a signal on any worker stops them all; the chief's clock says
      # which clocked actions are due (clocks differ between machines).
      stop, clock_bits = self.agreement.share(any_of=preemption.requested(),
                                              chiefs=float(boundaries.schedule.clock_bits()))
      boundary = self._boundary(position.step, train_metrics, position, loop)
      if stop:
        boundaries.preempted(boundary)  # the loop's values logged, its step saved: exit 42
      self.run.step_reached = position.step
      stopped_by = boundaries.run(boundary, int(clock_bits))
    progress.finish()
    batches = dropped_off_the_main_thread(batches)
    return Trained(position, train_metrics, throughput, stopped_by, boundaries.stop_reason)

  def _end_of_run(self, trained: Trained, watcher, started: float) -> dict:
    """After the last loop: its step on disk, the final eval, the export, MLflow's end,
    summary.json and finished.json (what waiters read). A signal agreed before the
    export ends the run as preempted (exit 42: the step is on disk); from there on it
    finishes."""
    step, total = trained.position.step, self.config.train.steps
    # resumed at the final step: the values the run logged there
    train_metrics = trained.train_metrics or self.metrics_log.last("train", step)
    self.train_state.wait()  # the final step is on disk before anything reports it
    if watcher.stop_agreed():
      raise Preempted(step)
    # What an Action at a phase from here on saves if it ends the run: the latest loop
    # boundary's position (None if this process trained no step: resumed at the end).
    position = trained.position if self.run.step_reached is not None else None
    eval_metrics = self.run.eval_metrics
    if self.run.evaluated_at != step:  # resumed at the final step, or stopped early
      eval_metrics = self.evaluate(step, position)
      if watcher.stop_agreed():
        raise Preempted(step)
    self.agreement.at_the_end()  # no worker leaves while a peer still reads its part
    exported = self.export(step, position)  # a signal from here on: finish, exit 0
    summary = self.run.summary(
        trained, {name: train_metrics.get(name) for name in self._train_sums.names},
        {name: eval_metrics.get(name) for name in self._eval_sums.names},
        eval_examples=eval_metrics.get("examples", 0), strategy=self.strategy,
        strategy_name=self.config.runtime.strategy, rollbacks=self._rollbacks.count,
        wall_seconds=time.perf_counter() - started)
    self.reporters.finish(summary, exported)
    self._phases.at_phase("summary", self._boundary(step, train_metrics, position))
    if self.is_chief:
      files.write_json(layout.summary_path(self.model_dir), summary)
      layout.write_finished(self.model_dir, step, total, stopped_by=trained.stopped_by,
                            why=trained.stop_reason)
    self.reporters.close()
    return summary

  def _begin(self, position: Position) -> None:
    """Before the first loop: the run recorded (config.json, run_id.json, the trackers'
    runs, each rewound to this step: no step reported twice) and described (TensorBoard)."""
    config = self.config
    self.reporters.start(config.to_dict(), position.step)  # may refuse (exit 2)
    if self.is_chief:
      layout.record_config(self.model_dir, config.to_dict(), position.step)
      self.train_state.record_run()  # run_id.json: the run the steps saved from now name
      layout.clear_finished(self.model_dir)  # training again: not finished until it ends
    self.summaries.describe_run(position.step, config.to_dict())
    if position.step == 0 and summaries.looks_like_images(self._probe[0]):
      self.summaries.sample_images(0, self._probe[0].numpy())
    described = assembly.describe(config, self.strategy, self.task, self.state, position.step)
    self.summaries.text(position.step, "model", "\n\n".join(described))

  def _boundary(self, step: int, train_metrics: dict, position: Position | None = None,
                loop: Loop | None = None) -> LoopBoundary:
    """What the Actions see at `step`; `position`: the loop's (None: no loop behind it)."""
    return LoopBoundary(
        step=step, train=dict(train_metrics), eval=self.run.eval_metrics,
        evaluated=self.run.evaluated_at == step, model_dir=self.model_dir,
        is_chief=self.is_chief, task=self.task, final=step >= self.config.train.steps,
        position=position, loop=loop, state=self.state)

  def _batches_from(self, position: Position):
    """The global batch sequence from `position` on (trainer/loop/batches.py)."""
    return self._batches.from_position(position, self.strategy, self.coordinator,
                                       decode_on_device=self._device_decode is not None)

  # -- eval and the saves -------------------------------------------------------

  def evaluate(self, step: int, position: Position | None = None) -> dict:
    """Every value of the task's eval step over every eval example exactly once.
    `position`: the loop's, when training evaluates (what an Action at the "eval" phase
    that ends the run saves)."""
    if not self._eval_sums.names:  # the task has no eval_step
      return {"examples": 0}
    start = time.perf_counter()
    self._phases.at_phase("eval", self._boundary(step, {}, position))
    with self.serving.weights(), user_code.running(f"{type(self.task).__name__}.eval_step",
                                                    f"in the eval at step {step}"):
      result = self._eval_sums.result(self._eval_pass()())  # host sync
    if not result["examples"]:  # a stream that was not empty at start-up: no 0.0 reported
      raise DataError(f"{self.eval_source.where}: the eval pass read no example")
    names = self._eval_sums.names
    self.reporters.write(step, "eval", {name: result[name] for name in [*names, "examples"]})
    self.summaries.flush()
    if self._read_only and self.is_chief:  # eval modes hold no lease: their events, now
      files.put_logs(self.model_dir)
    self.run.eval_seconds += time.perf_counter() - start
    logging.info("eval at step %d | %s | %d examples", step, metrics_line(result, names),
                 result["examples"])
    self.run.eval_metrics, self.run.evaluated_at = result, step
    return result

  def save(self, position: Position) -> None:
    """Starts an async checkpoint of `position` (once per step); refuses non-finite state.
    Training is blocked for the previous save still in flight, the host copy and the hand-off."""
    start = time.perf_counter()
    # The steps' TensorBoard events up to here in their files before the step can count
    # (a bucket's commit puts them in the bucket): kept in memory, a kill lost them, and
    # the run resumed from this step never logs them again.
    self.summaries.flush()
    if not self.train_state.save(position):
      return
    blocked = time.perf_counter() - start
    self.run.checkpoint_seconds += blocked
    if self.is_chief:
      logging.info("checkpoint at step %d started (blocked training %.3fs)", position.step,
                   blocked)

  def _save_and_stop(self, position: Position) -> None:
    """The preemption save: this step on disk, then Preempted (exit 42) in any case.
    If it cannot be written, the last complete checkpoint is where the next run resumes.
    No worker leaves before every worker is here, the chief's save done: a worker that
    exited at once (its own save is nothing to write) left the chief's stop agreement
    without its part ("Socket closed"), and the step it said was on disk never was."""
    unsaved = None
    try:
      self.save(position)
      self.train_state.wait()
    except StorageError as e:
      unsaved = str(e)
    self.agreement.at_the_end()
    if unsaved is not None:
      raise Preempted(position.step, unsaved=unsaved,
                      last_complete=self.train_state.latest_step())
    raise Preempted(position.step)

  # -- export ---------------------------------------------------------------------

  @property
  def evaluates(self) -> bool:
    """Whether the task's eval_step reports any value (a Task need not have one)."""
    return bool(self._eval_sums.names)

  def export(self, step: int, position: Position | None = None) -> str | None:
    """SavedModel of what the task serves at export/<step>/ (kept if it already exists);
    None if the task exports nothing. `position`: the loop's, when training exports
    (what an Action at the "export" phase that ends the run saves)."""
    return self.serving.export(step, before_write=lambda: self._phases.at_phase(
        "export", self._boundary(step, {}, position)))

  def restore(self, step: int) -> Position | None:
    """`step` loaded (continuous_eval's view of a job); None, with a warning, if unreadable."""
    return self.train_state.restore(step)

  def failure_step(self) -> int | None:
    """Where a failure after start-up is reported: the latest loop boundary this
    process reached, else the newest checkpoint."""
    if self.run.step_reached is not None:
      return self.run.step_reached
    return self.train_state.latest_step()

  def close(self, *, failing: bool = False) -> None:
    """`failing`: the run is ending with an error already; the TensorBoard rows a full
    disk cannot take then get a warning, not a second error in place of that one (a
    preemption's exit 42 included)."""
    self.train_state.close()
    self.summaries.close(quiet=failing)
    self.reporters.close()  # the trackers' runs end; the store's writers are closed by then
