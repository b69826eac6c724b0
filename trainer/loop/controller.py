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

Here: wiring (__init__), the flow (train), the boundary and its actions, eval,
rollback, progress, the datasets, export.
"""
import contextlib
import math
import os
import threading
import time
from typing import Callable

from absl import logging
import ml_collections
import tensorflow as tf

from input_pipelines import autograph_scope
from input_pipelines import batching
from input_pipelines.errors import DataError
from input_pipelines.sources import Source
from trainer import task as tasks
from trainer.loop import assembly
from trainer.cluster import preemption
from trainer.cluster import runtime
from trainer.cluster import sharding
from trainer.cluster.agreement import Agreement
from trainer.loop import actions as actions_module
from trainer.loop import metrics_log
from trainer.loop import mlflow_log
from trainer.loop import profiling
from trainer.loop import progress
from trainer.loop import steps
from trainer.loop import summaries
from trainer.state import elastic
from trainer.state import export
from trainer.state import mirror
from trainer.state import model_dir as layout
from trainer.state.train_state import Position, TrainState
from trainer.setup import epochs
from trainer.loop import preprocess
from trainer.setup import run_fields
from trainer.task import user_code
from trainer.state.task_state import TaskState, load_model_weights
from trainer.errors import NonFiniteError, Preempted, StorageError, UserCodeHung, UserError


_PROBE_EXAMPLES = 8  # training examples the start-up checks and TensorBoard's samples use


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
    # train.epochs (trainer/setup/epochs.py): config.train.steps were derived from the newest
    # checkpoint's data position; the one restored must make the same steps.
    self._epoch_plan = epoch_plan
    self._position: Position | None = None  # the latest loop boundary's (set by train)
    self.model_dir = model_dir
    self.strategy = strategy
    self.train_source, self.eval_source = splits
    self._epoch_size = epochs.num_examples(self.train_source)  # None: a tf.data stream
    self._user_actions = [*actions_module.resolve(config.train.actions, config), *actions]
    for action in self._user_actions:  # a blocked Action cannot keep the job from ending
      action.guard = self._run_user_action
    self._preprocess = preprocess.resolve(config.data.preprocess, self.train_source)
    # A few real training examples: the task's input spec, the start-up checks, samples.
    probe = self._train_dataset(start_example=0, stream="probe",
                                global_batch_size=_PROBE_EXAMPLES)
    self._probe = next(iter(probe))
    # None wherever the data varies (data.pad_to): the model and the export take any length.
    self.features_spec, labels_spec = batching.batch_spec(self.train_source, probe.element_spec,
                                                          self._probe)
    self.is_chief = runtime.is_chief(strategy)
    self.agreement = Agreement(strategy)
    # parameter_server: this process is the coordinator; it schedules steps on the workers.
    self.coordinator = runtime.coordinator(strategy)
    self.task = assembly.create_task(config, task)
    # Optimizer slots of a sharded variable are sharded like it (trainer/cluster/sharding.py).
    with (strategy.scope(), sharding.slots_follow_shards(),
          steps.one_copy_takes_the_first_replicas(strategy)):
      context = tasks.BuildContext(config, self.features_spec, labels_spec, self._probe,
                                   strategy, load_weights=load_model_weights)
      context.sources = splits
      user_code.build(self.task, context)
      self.state = TaskState(self.task, float16=config.runtime.mixed_precision == "float16")
    # On an accelerator uint8 images cross to it and are scaled there (unless a
    # per-example preprocess must see them decoded first); on a CPU the host is the
    # device, and decoding in tf.data keeps the arithmetic of every source the same.
    self._on_accelerator = runtime.has_accelerator(strategy)
    self._device_decode = (batching.device_decoder(self.train_source)
                           if self._preprocess is None and self._on_accelerator else None)
    jit_compile = runtime.jit_compile(config.runtime, strategy)
    fuse_whole_step = runtime.fuses_whole_step(config.runtime, strategy, jit_compile)
    communication_options = None if self.coordinator else runtime.communication_options(
        config.runtime)

    def step_context(step, tracing_only=False):
      return tasks.StepContext(
          step=step, global_batch_size=config.train.global_batch_size,
          num_replicas=strategy.num_replicas_in_sync, seed=config.runtime.seed,
          loss_scales=self.state.loss_scales, clip_norm=config.train.clip_grad_norm,
          communication_options=communication_options,
          jit_compile=jit_compile and not fuse_whole_step, fused_kernels=not jit_compile,
          tracing_only=tracing_only,
          per_example_randomness=config.runtime.deterministic and not self.coordinator)

    # What the steps return, by name (traced once, nothing runs): the layout of the sums.
    replica_batch = config.train.global_batch_size // (
        1 if self.coordinator else strategy.num_replicas_in_sync)
    train_spec = tf.nest.map_structure(
        lambda s: tf.TensorSpec([replica_batch, *s.shape[1:]], s.dtype),
        (self.features_spec, labels_spec))

    def traced_train_step(batch):
      context_ = step_context(tf.constant(0, tf.int64), tracing_only=True)
      return (context_.call(autograph_scope.user_function(self.task.train_step), batch),
              context_.gradient_norms)

    with strategy.scope():
      replicas = None if self.coordinator else strategy  # the coordinator reads the servers
      train_names, norms, train_scalars = user_code.traced(lambda: steps.discover(
          traced_train_step, train_spec, "train_step", replicas, self.state.check_step,
          lengths_must_be_static=fuse_whole_step), self.task)
      eval_names, _, _ = user_code.traced(lambda: steps.discover(  # a static batch: lengths checked
          lambda batch: (autograph_scope.user_function(self.task.eval_step)(batch), {}), train_spec, "eval_step", replicas,
          self.state.check_step), self.task)
    # A per-step scalar must be the same on every replica: checked once per loop where
    # there are several (distloop's own task's only scalar, model.losses of the mirrored
    # weights, is by construction; its runs pay nothing).
    checked = (train_scalars if strategy.num_replicas_in_sync > 1 and not self.coordinator
               and not type(self.task).__module__.startswith("trainer.") else [])
    self._train_sums = steps.Sums(train_names,
                                  list(norms) if config.train.report_gradient_norm else [],
                                  checked=checked)
    self._eval_sums = steps.Sums(eval_names, what="eval_step")
    self._train_names = [name for name in train_names if name != "regularization_loss"]
    self._eval_names = eval_names
    if ((config.checkpoint.keep_best or config.checkpoint.early_stop_patience)
        and not read_only and config.checkpoint.best_metric not in eval_names):
      raise UserError(f"checkpoint.best_metric={config.checkpoint.best_metric!r} is not "
                      f"reported by the eval step (choose from: "
                      f"{', '.join(eval_names) or 'none: the task has no eval_step'})")
    self._read_only = read_only
    # self.state: the task's variables; self.train_state: their checkpoints in model_dir.
    self.train_state = TrainState(config, model_dir,
                                  model_variables=self.state.model_variables,
                                  optimizer_variables=self.state.optimizer_variables,
                                  agreement=self.agreement, is_chief=self.is_chief,
                                  read_only=read_only, task_name=_task_name(self.task),
                                  may_change=run_fields.may_change(self.task, config.to_dict()),
                                  shape=elastic.shape(
                                      replicas=strategy.num_replicas_in_sync,
                                      workers=runtime.num_workers(strategy),
                                      strategy=config.runtime.strategy),
                                  replica_dependence=self.state.replica_dependence(
                                      config.runtime.deterministic),
                                  strategy_dependence=self.state.strategy_dependence(
                                      config.runtime.deterministic))
    self.checkpoints = self.train_state.checkpoints  # continuous_eval and the api read it
    self.summaries = summaries.Summaries(model_dir, enabled=self.is_chief)
    self.metrics_log = metrics_log.MetricsLog(model_dir, enabled=self.is_chief and not read_only)
    self.mlflow_log = mlflow_log.MlflowLog(config.runtime, model_dir,
                                           enabled=self.is_chief and not read_only)
    self.profiler = profiling.ProfileWindow(config.runtime.profile_steps, self.summaries.root,
                                            trace=self.is_chief)
    replica_step = steps.make_replica_step(self.task, self._train_sums, step_context,
                                           decode=self._device_decode,
                                           fuse_whole_step=fuse_whole_step)
    if self.coordinator:
      self._train_loop = steps.make_parameter_server_train_loop(
          self.coordinator, replica_step, self._train_sums, self.state.all_variables(),
          num_workers=runtime.num_workers(strategy),
          learning_rates=self.state.learning_rate_vector)
    else:
      self._train_loop = steps.make_train_loop(strategy, replica_step, self._train_sums,
                                               self.state.all_variables(),
                                               self.state.model_variables.values(),
                                               learning_rates=self.state.learning_rate_vector)
    self._eval_pass = None  # built on first use: the eval data is distributed once
    self._clock = clock
    self._schedule = actions_module.Schedule(self._user_actions, config.train.steps)
    self._stopped_by = None  # the action that stopped training early, if one did
    self._evaluated_at = None  # the step of the latest eval
    self._eval_metrics = None
    self._last_loop = (0, 0.0)  # (steps, seconds) of the latest loop
    self._learning_rates = {}  # the next step's rates, read with the latest loop's sums
    self._rollbacks = 0
    self._eval_seconds = 0.0
    self._checkpoint_seconds = 0.0

  def _refuse_replica_dependent(self, names: list, step: int, num_steps: int) -> None:
    """Per-step scalars `names` differed between the replicas in the loop that just ran
    (Sums.reduce_checked): their mean over replicas would change with the replica count,
    so the run stops here, before anything of the loop is kept (exit 2, as a per-example
    value of the wrong length found as the step runs)."""
    if not names:
      return
    quoted = ", ".join(repr(name) for name in names)
    raise UserError(
        f"{type(self.task).__name__}.train_step returned per-step scalar(s) {quoted} that "
        f"differed between the {self.strategy.num_replicas_in_sync} replicas in steps "
        f"{step + 1}..{step + num_steps}: a per-step scalar must be the same on every replica, "
        f"not depend on the replica's share of the batch; return per-example values [batch] "
        f"(distloop sums them over the global batch) or reduce it over the global batch "
        f"with the step's collective (e.g. tf.reduce_max(step.all_gather(per_example)))")

  # -- the flow ---------------------------------------------------------------

  def train(self, *, eval_interval: int) -> dict:
    """Trains to train.steps, evaluating every `eval_interval` steps (0: at the end only)."""
    started = time.perf_counter()
    config = self.config
    total, batch_size = config.train.steps, config.train.global_batch_size

    self._served()  # an export that cannot be made is refused now, not after training
    # Refuses another model's checkpoints (and an unreachable MLflow) before anything is
    # written or moved.
    self.mlflow_log.connect()
    position = self.train_state.restore_latest() or self.train_state.warm_start()
    self._check_epoch_steps(position)
    started_at = position.step
    watcher = preemption.PreemptionWatcher(self.agreement)
    schedule = actions_module.Schedule(self._actions_in_order(eval_interval), total)
    self._schedule = schedule
    schedule.at_phase("restored", self._boundary(position.step, {}))
    if watcher.stop_agreed():  # signalled during start-up or restore: nothing new to save
      raise Preempted(position.step if self.train_state.latest_step() is not None else None)
    self.mlflow_log.start(config.to_dict())  # may refuse (exit 2): before any write
    if self.is_chief:
      layout.record_config(self.model_dir, config.to_dict(), position.step)
      self.train_state.record_run()  # run_id.json: the run the steps saved from now name
      layout.clear_finished(self.model_dir)  # training again: not finished until it ends
    self.metrics_log.restart_at(position.step)  # a step re-trained is logged once
    self.summaries.restart_at(position.step)
    self.summaries.describe_run(position.step, config.to_dict())
    if position.step == 0 and _looks_like_images(self._probe[0]):
      self.summaries.sample_images(0, self._probe[0].numpy())
    if getattr(self.task, "num_classes_from", None):  # the built-in task resolved it
      logging.info("model.num_classes=%d, from the data (%s)",
                   self.task.model_config.num_classes, self.task.num_classes_from)
    threads = runtime.threads_per_op()
    logging.info("Training %s on %s with %d replica(s) (%s, %s CPU kernels%s) from step %d to "
                 "%d.", _what_trains(config), config.data.name, self.strategy.num_replicas_in_sync,
                 config.runtime.strategy, runtime.cpu_kernels(),
                 f", {threads} thread(s) per op" if threads else "", position.step, total)
    described = self.state.describe()
    described += sharding.placement({**self.state.model_variables,
                                     **self.state.optimizer_variables})
    if config.train.accumulation_steps > 1:
      micro = batch_size // self.strategy.num_replicas_in_sync // config.train.accumulation_steps
      described.append(f"each step: {config.train.accumulation_steps} micro-batches of {micro} "
                       f"per replica, gradients summed, one reduction (global batch "
                       f"{batch_size})")
    for line in described:
      logging.info("%s", line)
    self.summaries.text(position.step, "model", "\n\n".join(described))

    self._throughput = progress.Throughput()
    train_metrics, self._eval_metrics = {}, None
    record_graph = position.step == 0 and self.coordinator is None  # the step graph, once
    with watcher, contextlib.closing(self.profiler):
      batches = self._batches_from(position)
      schedule.restart_clocks()
      self.profiler.at_boundary(position.step)
      stopped_early = False
      while position.step < total and not stopped_early:
        num_steps = min(config.train.steps_per_loop, total - position.step,
                        schedule.steps_to_next(position.step))
        loop_start = time.perf_counter()
        with (self.summaries.graph_of_first_call(position.step) if record_graph
              else contextlib.nullcontext()), user_code.running(
                  f"{type(self.task).__name__}.train_step",
                  f"in steps {position.step + 1}..{position.step + num_steps}"):
          state_finite, totals, learning_rates = self._train_loop(
              batches, tf.constant(num_steps), tf.constant(position.step, tf.int64))
        record_graph = False
        train_metrics = self._train_sums.result(totals)  # host sync: the n steps
        self._refuse_replica_dependent(self._train_sums.disagreeing(totals), position.step,
                                       num_steps)
        loop_seconds = time.perf_counter() - loop_start
        reached = position.advance(num_steps, batch_size)
        non_finite = [name for name in self._train_sums.names
                      if not math.isfinite(train_metrics[name])]
        if non_finite or not bool(state_finite):
          position = self._roll_back(position, reached, non_finite, train_metrics)
          batches = self._batches_from(position)
          continue
        position = reached
        self._throughput.add(num_steps * batch_size, loop_seconds)
        self._last_loop = (num_steps, loop_seconds)
        self._learning_rates = self.state.learning_rates(learning_rates)  # the next step's

        # One collective: a signal on any worker stops them all; the chief's clock says
        # which clocked actions are due (clocks differ between machines).
        stop, clock_bits = self.agreement.share(any_of=preemption.requested(),
                                                chiefs=float(schedule.clock_bits()))
        if stop:
          self._save_and_stop(position)
        stopped_early = self._at_boundary(schedule, position, train_metrics, int(clock_bits))

    progress.finish()
    if not train_metrics:  # resumed at the final step: the values the run logged there
      train_metrics = self.metrics_log.last("train", position.step)
    batches = _dropped_off_the_main_thread(batches)
    self.train_state.wait()  # the final step is on disk before anything reports it
    if watcher.stop_agreed():
      raise Preempted(position.step)
    eval_metrics = self._eval_metrics
    if self._evaluated_at != position.step:  # resumed at the final step, or stopped early
      eval_metrics = self.evaluate(position.step)
      if watcher.stop_agreed():
        raise Preempted(position.step)
    self.agreement.at_the_end()  # no worker leaves while a peer still reads its part
    exported = self.export(position.step)  # a signal from here on: finish (seconds), exit 0
    self.mlflow_log.finish(exported)
    summary = {
        "step": position.step,
        # The built-in task's train_loss is the data loss + the regularization, as trained.
        **{f"train_{name}": train_metrics.get(name) for name in self._train_sums.names},
        **{f"eval_{name}": eval_metrics.get(name) for name in self._eval_names},
        "eval_examples": eval_metrics.get("examples", 0),
        "examples_per_sec": self._throughput.per_second(),
        "num_replicas": self.strategy.num_replicas_in_sync,
        "strategy": config.runtime.strategy,
        "rollbacks": self._rollbacks,
        # Steps this process trained (0: resumed at the final step; train_* are then the
        # values logged there).
        "trained_steps": position.step - started_at,
        "wall_time_sec": time.perf_counter() - started,
        "train_time_sec": self._throughput.seconds,
        "eval_time_sec": self._eval_seconds,
        "checkpoint_time_sec": self._checkpoint_seconds,
    }
    if self._stopped_by is not None:
      summary["stopped_early_by"] = self._stopped_by
    schedule.at_phase("summary", self._boundary(position.step, train_metrics))
    if self.is_chief:
      layout.write_json(layout.summary_path(self.model_dir), summary)
      layout.write_finished(self.model_dir, position.step, total, stopped_by=self._stopped_by)
    self.summaries.close()
    self.metrics_log.close()
    return summary

  # -- the loop boundary: actions ---------------------------------------------------

  def _builtin_actions(self, eval_interval: int) -> list:
    """distloop's own periodic work, in the order it runs at a boundary; the user's
    actions run after these, the checkpoint last (so that a "save" is this step's)."""
    config = self.config
    self._save_by_clock = actions_module.Action(
        self._save_if_due, every_steps=config.checkpoint.interval, at_end=True,
        every_seconds=config.checkpoint.interval_seconds, name="checkpoint",
        clock=self._clock)
    self._early_stop = actions_module.Action(
        self._stop_if_no_better, after_eval=True,
        name="early_stop") if config.checkpoint.early_stop_patience else None
    return [
        actions_module.Action(self._report_progress, every_boundary=True, name="progress"),
        profiling.ProfileAction(self.profiler),
        actions_module.Action(self._evaluate_at_boundary, every_steps=eval_interval,
                              at_end=True, name="eval"),
        actions_module.Action(self._keep_if_best, after_eval=True, name="keep_best"),
        *([self._early_stop] if self._early_stop else []),
    ]

  def _actions_in_order(self, eval_interval: int) -> list:
    """The built-ins, the user's, then the checkpoint (it runs last: see _at_boundary)."""
    return [*self._builtin_actions(eval_interval), *self._user_actions, self._save_by_clock]

  @property
  def step_reached(self) -> int | None:
    """The step of this run's latest loop boundary (None before its first): where a
    failure after it is reported."""
    return None if self._position is None else self._position.step

  def _at_boundary(self, schedule, position: Position, train_metrics: dict,
                   clock_bits: int) -> bool:
    """Runs the actions due at this boundary, in order; returns whether training stops
    early here (an action decided "stop": agreed by every worker)."""
    boundary = self._boundary(position.step, train_metrics)
    self._position = position
    deciding = {id(action) for action in [*self._user_actions, self._early_stop] if action}
    decided, user_ran, ran = {}, False, set()
    for action in schedule.actions:
      if action is self._save_by_clock:
        continue  # last, once the decisions are known
      if not action.due(position.step, schedule.last_step, evaluated=boundary.evaluated,
                        clock_due=schedule.clock_due(action, clock_bits)):
        continue
      ran.add(id(action))
      decision = action.run(boundary)
      if id(action) in deciding:
        user_ran = True
        if decision:
          decided.setdefault(decision, action.name)
    stop = save = preempted = False
    if user_ran:  # the same boundaries on every worker: one collective, all decide alike
      # A stop asked while they ran (a signal, an Action's KeyboardInterrupt) is agreed
      # here too: this step is saved, not the next boundary's.
      stop, save, preempted = self.agreement.any_of_each(
          ["stop" in decided, "save" in decided, preemption.requested()])
    if preempted:
      self._save_and_stop(position)
    if stop:  # finish as at the last step: its at_end actions (the final eval first)
      boundary.final = True
      for action in schedule.due_when_stopping(boundary, ran, last=self._save_by_clock):
        action.run(boundary)  # a decision changes nothing now: this step is saved, the end
    clock_due = schedule.clock_due(self._save_by_clock, clock_bits)
    if clock_due and not self._save_by_clock.due(position.step, schedule.last_step,
                                                 evaluated=False, clock_due=False):
      logging.info("checkpoint.interval_seconds passed on the chief's clock: saving step %d",
                   position.step)
    if stop or save or self._save_by_clock.due(position.step, schedule.last_step,
                                               evaluated=False, clock_due=clock_due):
      self._save_by_clock.run(boundary)
    if stop:
      self._stopped_by = decided.get("stop", actions_module.ANOTHER_WORKERS)
      logging.info("%s", actions_module.stop_line(decided.get("stop"), position.step))
    return stop

  def _run_user_action(self, action, boundary) -> str | None:
    """A user's Action, bounded (trainer/cluster/preemption.py): left running after a signal
    (its boundary's step saved, exit 42) or past train.action_timeout_seconds (exit 1).
    It cannot end the process behind the run's back either: sys.exit is a failure
    (its step saved, exit 1), KeyboardInterrupt a stop as on SIGINT (saved, exit 42)."""
    limit = self.config.train.action_timeout_seconds
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

  def _save_boundary_step(self, boundary) -> tuple[int | None, str]:
    """Saves the step of `boundary` (where a user's Action ended the run) when it is
    the loop's current step and not on disk yet; returns (the latest step on disk, why
    `boundary`'s could not be saved, or "")."""
    position = self._position
    on_disk, unsaved = self.train_state.latest_step(), ""
    if (position is not None and position.step == boundary.step and not self._read_only
        and position.step != on_disk):
      if self.coordinator or runtime.num_workers(self.strategy) == 1:
        try:  # the weights are the boundary's: the Action runs after the loop
          self.save(position)
          self.train_state.wait()
          on_disk = position.step
        except StorageError as e:
          unsaved = str(e)
      else:  # a save is a collective: the other workers may be elsewhere
        unsaved = "other workers may be inside the Action: no agreed save"
    return on_disk, unsaved

  def _check_epoch_steps(self, position: Position) -> None:
    """train.epochs' steps were counted at start-up from the newest checkpoint's data
    position (its meta, read as JSON). A restore that fell back to an older step (the
    newest unreadable, now set aside) whose data position makes other steps at this
    batch would end the run off its epochs, or its schedules off their length:
    refused, and the next run counts from the step restored. Agreed: every worker stops."""
    plan = self._epoch_plan
    if plan is None:  # the same on every worker: the same config
      return
    if self.agreement.any(plan.final_step(position.step, position.examples)
                          != self.config.train.steps):
      raise UserError(
          f"train.epochs={plan.epochs:g} made {self.config.train.steps} steps from the newest "
          f"checkpoint, but training resumed from step {position.step} ({position.examples} "
          f"examples used), where they make {plan.final_step(position.step, position.examples)}"
          f": run again to count them from step {position.step}")

  def _boundary(self, step: int, train_metrics: dict) -> actions_module.Boundary:
    return actions_module.Boundary(
        step=step, train=dict(train_metrics), eval=self._eval_metrics,
        evaluated=self._evaluated_at == step, model_dir=self.model_dir,
        is_chief=self.is_chief, task=self.task, final=step >= self.config.train.steps)

  def _evaluate_at_boundary(self, boundary) -> None:
    boundary.eval = self.evaluate(boundary.step)
    boundary.evaluated = True

  def _save_if_due(self, boundary) -> None:
    self.save(self._position)

  # -- the periodic work --------------------------------------------------------

  def evaluate(self, step: int) -> dict:
    """Every value of the task's eval step over every eval example exactly once."""
    if not self._eval_names:  # the task has no eval_step
      return {"examples": 0}
    start = time.perf_counter()
    self._schedule.at_phase("eval", self._boundary(step, {}))
    if self._eval_pass is None:
      decode = batching.device_decoder(self.eval_source) if self._on_accelerator else None

      def dataset(input_context=None):
        return batching.eval_dataset(self.eval_source,
                                     global_batch_size=self.config.eval.global_batch_size,
                                     input_context=input_context,
                                     decode_on_device=decode is not None)
      if self.coordinator:
        self._eval_pass = steps.make_eval_pass(None, self.task, self._eval_sums, dataset(),
                                               decode)
      else:  # each worker reads only its replicas' slices of every eval batch
        self._eval_pass = steps.make_eval_pass(
            self.strategy, self.task, self._eval_sums,
            self.strategy.distribute_datasets_from_function(dataset), decode)
    with self._served_weights(), user_code.running(f"{type(self.task).__name__}.eval_step",
                                                   f"in the eval at step {step}"):
      result = self._eval_sums.result(self._eval_pass())  # host sync
    if not result["examples"]:  # a stream that was not empty at start-up: no 0.0 reported
      raise DataError(f"{self.eval_source.where}: the eval pass read no example")
    self.summaries.scalars("eval", step, {name: result[name] for name in self._eval_names})
    self._log_metrics(step, "eval", {name: result[name]
                                     for name in [*self._eval_names, "examples"]})
    self.summaries.flush()
    if self._read_only and self.is_chief:  # eval modes hold no lease: their events, now
      bucket = mirror.of(self.model_dir)
      if bucket is not None:
        bucket.push_logs()
    self._eval_seconds += time.perf_counter() - start
    logging.info("eval at step %d | %s | %d examples", step,
                 _metrics_line(result, self._eval_names), result["examples"])
    self._eval_metrics, self._evaluated_at = result, step
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
    if self._save_by_clock.timer is not None:  # checkpoint.interval_seconds counts from here
      self._save_by_clock.timer.restart()
    self._checkpoint_seconds += blocked
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

  def _log_metrics(self, step: int, split: str, values: dict) -> None:
    """metrics.csv, and MLflow with runtime.mlflow_uri (TensorBoard has them already)."""
    self.metrics_log.write(step, split, values)
    self.mlflow_log.write(step, split, values)

  def _keep_if_best(self, boundary) -> None:
    self.train_state.keep_best(self._position, boundary.eval)

  def _stop_if_no_better(self, boundary) -> str | None:
    """checkpoint.early_stop_patience: "stop" once checkpoint.best_metric has not beaten
    its best by early_stop_min_delta for that many evals in a row. The count lives in
    the checkpoints (train_state.action_state): a resumed run goes on counting."""
    settings = self.config.checkpoint
    value = boundary.eval[settings.best_metric]
    state = self.train_state.action_state.setdefault(
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

  def _report_progress(self, boundary) -> None:
    """The progress line and TensorBoard's train scalars of the loop that just ended."""
    step, metrics = boundary.step, boundary.train
    num_steps, loop_seconds = self._last_loop
    examples_per_sec = num_steps * self.config.train.global_batch_size / loop_seconds
    learning_rates = self._learning_rates
    epoch = epochs.epoch(self._position.examples, self._epoch_size)
    reported = {
        **({"epoch": epoch} if epoch is not None else {}),
        **{name: metrics[name] for name in self._train_sums.names},
        **learning_rates, "examples_per_sec": examples_per_sec,
        "steps_per_sec": num_steps / loop_seconds,
        **{name: metrics[name]
           for name in self._train_sums.norm_names if name in metrics}}
    self.summaries.scalars("train", step, reported)
    self._log_metrics(step, "train", reported)
    rates = " ".join(f"{rate:.3g}" for rate in learning_rates.values())
    progress.show(step, self.config.train.steps,
                  ("" if epoch is None else f"epoch {epoch:.2f} | ") +
                  f"{_metrics_line(metrics, self._train_names)} | lr {rates} | "
                  f"{examples_per_sec:.0f} examples/s | "
                  f"ETA {_eta(self.config.train.steps - step, loop_seconds / num_steps)}")

  def _train_dataset(self, *, start_example: int, global_batch_size: int | None = None,
                     salted: bool = False, input_context=None, stream: str = "train",
                     decode_on_device: bool = False) -> tf.data.Dataset:
    return batching.train_dataset(
        self.train_source, seed=self.config.runtime.seed,
        global_batch_size=global_batch_size or self.config.train.global_batch_size,
        start_example=start_example, preprocess=self._preprocess, salted=salted,
        input_context=input_context, stream=stream, decode_on_device=decode_on_device)

  # -- state in and out: trainer/state/train_state.py; the rollback policy ----------

  def restore_latest(self) -> Position | None:
    """The newest readable checkpoint loaded (trainer/state/train_state.py says how)."""
    return self.train_state.restore_latest()

  def restore(self, step: int) -> Position | None:
    """`step` loaded; None (with a warning) if unreadable."""
    return self.train_state.restore(step)

  def _roll_back(self, position: Position, reached: Position, non_finite: list,
                 train_metrics: dict) -> Position:
    """Non-finite values (`non_finite`: the names of the step's), weights or optimizer
    state in the loop that ended at `reached`."""
    in_state = self.train_state.non_finite_keys() if not non_finite else None
    what = (f"non-finite {non_finite[0]} ({train_metrics[non_finite[0]]})" if non_finite
            else f"non-finite values in {(in_state or ['the state'])[0]}")
    where = (f"in steps {position.step + 1}..{reached.step}"
             if reached.step > position.step + 1 else f"in step {reached.step}")
    policy = self.config.train.nonfinite_policy
    last = self.train_state.last_checkpoint_words
    if policy == "stop":
      raise NonFiniteError(f"{what} {where}; stopped without saving them ({last()})")
    if self._rollbacks >= self.config.train.max_rollbacks:
      raise NonFiniteError(f"{what} {where} after {self._rollbacks} rollback(s) "
                           f"(train.max_rollbacks); stopped ({last()})")
    restored = self.train_state.restore_latest()
    if restored is None:
      raise NonFiniteError(f"{what} {where}, and no checkpoint to roll back to")
    self._rollbacks += 1
    self.metrics_log.restart_at(restored.step)
    self.summaries.restart_at(restored.step)
    logging.warning("%s %s: rolled back to step %d and skipped the data up to example %d "
                    "(rollback %d of %d)", what, where, restored.step, reached.examples,
                    self._rollbacks, self.config.train.max_rollbacks)
    return Position(restored.step, reached.examples)

  def _batches_from(self, position: Position):
    on_device = self._device_decode is not None  # uint8 across, scaled by the step
    if self.coordinator:
      # Asynchronous workers cannot split one stream exactly: each reads its own
      # order of the data (a per-worker salt), from the checkpointed position.
      return iter(self.coordinator.create_per_worker_dataset(
          lambda: self._train_dataset(start_example=position.examples, salted=True,
                                      decode_on_device=on_device)))
    # Each worker builds only its replicas' shares of every global batch.
    return iter(self.strategy.distribute_datasets_from_function(
        lambda input_context: self._train_dataset(start_example=position.examples,
                                                  input_context=input_context,
                                                  decode_on_device=on_device)))

  @property
  def evaluates(self) -> bool:
    """Whether the task's eval_step reports any value (a Task need not have one)."""
    return bool(self._eval_names)

  def exports(self) -> bool:
    """Whether the task's export() serves a model (a Task need not have one); checked as
    export() is: UserError if what it serves cannot be served."""
    return self._served() is not None

  def export(self, step: int) -> str | None:
    """SavedModel of what the task serves at export/<step>/ (kept if it already exists);
    None if the task exports nothing."""
    served = self._served()
    if served is None:
      return None
    destination = layout.export_dir(self.model_dir, step)
    if not self.is_chief or os.path.isdir(destination):
      return destination
    with self._served_weights():
      export.export_saved_model(
          served, destination,
          before_write=lambda: self._schedule.at_phase("export", self._boundary(step, {})),
          examples=self._probe[0], features_spec=self.features_spec)
    logging.info("Exported SavedModel to %s", destination)
    return destination

  def _served(self):
    """The task's Export, its input_spec set and traced (UserError if it cannot be served)."""
    return export.exported(
        self.task, export.serving_spec(self.features_spec, self.train_source.feature_name),
        self._probe[0])

  def _served_weights(self):
    """What eval and export see: the moving averages (train.ema_decay, or an optimizer of
    the task with use_ema) unless train.ema_eval=false; training goes on from its own."""
    if self.config.train.ema_eval:
      return self.state.averaged_weights()
    return contextlib.nullcontext()

  def close(self, *, failing: bool = False) -> None:
    """`failing`: the run is ending with an error already; the TensorBoard rows a full
    disk cannot take then get a warning, not a second error in place of that one (a
    preemption's exit 42 included)."""
    self.train_state.close()
    self.summaries.close(quiet=failing)
    self.metrics_log.close()


TEARDOWNS = []  # threads dropping training iterators (see _dropped_off_the_main_thread)


def _dropped_off_the_main_thread(iterator) -> None:
  """Drops the training iterator in a thread of its own: its teardown waits for tf.data's
  threads (1-3 s on a quiet machine, 20-80 s on a busy one: issue 31) and nothing after
  the loop needs it; the CLI leaves (os._exit) without waiting for it, the Python API
  waits for it before it returns (join_teardowns)."""
  held = [iterator]
  del iterator
  thread = threading.Thread(target=held.clear, name="distloop: training iterator teardown",
                            daemon=True)
  thread.start()
  TEARDOWNS.append(thread)


def join_teardowns() -> None:
  """Waits for the iterators dropped off the main thread (the Python API, before it returns:
  a teardown still running when the interpreter finalizes could deadlock it)."""
  while TEARDOWNS:
    TEARDOWNS.pop().join()


def _eta(remaining_steps: int, seconds_per_step: float) -> str:
  seconds = int(remaining_steps * seconds_per_step)
  return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def _metrics_line(values: dict, names) -> str:
  return " | ".join(f"{name} {values[name]:.4f}" for name in names)


def _looks_like_images(features) -> bool:
  """TensorBoard's input samples: only for one [b, H, W, 1|3|4] array of features."""
  return (tf.is_tensor(features) and features.shape.rank == 4 and features.shape[-1] in (1, 3, 4)
          and (features.dtype.is_floating or features.dtype == tf.uint8))


def _task_name(task) -> str:
  return f"{type(task).__module__}:{type(task).__qualname__}"


def _what_trains(config) -> str:
  return f"train.task={config.train.task}" if config.train.task else config.model.name
