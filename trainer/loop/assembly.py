"""What the loop is assembled from, before the flow begins: the run's Task, built under
the strategy from a few real training examples; its steps traced once for what they
return (the layout of the sums); the compiled train loop and eval pass; the TrainState
that checkpoints the task's variables; and, as the run starts, the run in words.

Why apart from the controller: this runs once, at construction (the eval pass at the
first eval), reads and writes nothing, and the flow (trainer/loop/controller.py) needs
only what it made (an `Assembly`).
"""
import dataclasses
from typing import Callable

from absl import logging
import tensorflow as tf

from input_pipelines import autograph_scope
from input_pipelines import batching
from trainer import task as tasks
from trainer.cluster import runtime
from trainer.cluster import sharding
from trainer.errors import UserError
from trainer.loop import learning_rate
from trainer.loop import steps
from trainer.setup import plugins
from trainer.setup import run_fields
from trainer.state import elastic
from trainer.state.task_state import TaskState, load_model_weights
from trainer.state.train_state import TrainState
from trainer.task import user_code
from trainer.task.contract import Task


def create_task(config, task=None):
  """The run's Task (a trainer.Task): `task` (a Task instance or class, or a function
  of the config returning one), else train.task (MODULE:FUNCTION, the same), else the
  built-in supervised step."""
  spec = task if task is not None else config.train.task
  if spec in (None, ""):
    from trainer.supervised.task import SupervisedTask  # pylint: disable=g-import-not-at-top
    return SupervisedTask()
  field = "train.task"
  shown = spec if isinstance(spec, str) else repr(spec)
  made = plugins.resolve(field, spec) if isinstance(spec, str) else spec
  if not isinstance(made, Task):  # a Task class, or a function of the config
    made = (plugins.call(field, shown, made) if isinstance(made, type)
            else plugins.call(field, shown, made, config))
  if not isinstance(made, Task):
    raise UserError(f"{field}={shown!r} gave {type(made).__name__}, not a trainer.Task")
  return made


@dataclasses.dataclass(frozen=True)
class Assembly:
  """What the Trainer runs. `state`: the task's variables; `train_sums`, `eval_sums`: what
  the steps return, by name (the layout of the loops' sums); `train_loop(batches,
  num_steps, first_step) -> (state finite, totals, learning rates)`: compiled;
  `device_decode`: the batch decode the step runs on an accelerator (None: decoded by
  tf.data)."""
  state: TaskState
  train_sums: steps.Sums
  eval_sums: steps.Sums
  train_loop: Callable | None  # None in a mode that does not train
  device_decode: Callable | None
  on_accelerator: bool


def assemble(config, strategy: tf.distribute.Strategy, coordinator, task: Task, splits,
             probe, features_spec, labels_spec, *, preprocessed: bool,
             read_only: bool, factored: bool = False) -> Assembly:
  """`task` built on the `probe` batch, its steps traced, the train loop compiled.
  `coordinator`: parameter_server's (this process schedules steps on the workers), else
  None; `preprocessed`: a per-example data.preprocess runs in tf.data; `factored`: the
  optimizers run on the run's learning rate factor (trainer/loop/learning_rate.py)."""
  # Optimizer slots of a sharded variable are sharded like it (trainer/cluster/sharding.py).
  # Keras's default seeds from the config alone (runtime.keras_seeds_from: a bucket
  # client's retries draw from Python's global `random` meanwhile).
  with (strategy.scope(), sharding.slots_follow_shards(),
        steps.one_copy_takes_the_first_replicas(strategy),
        runtime.keras_seeds_from(config.runtime.seed)):
    factor = tf.Variable(1.0, trainable=False, name="learning_rate_factor") if factored else None
    context = tasks.BuildContext(config, features_spec, labels_spec, probe, strategy,
                                 load_weights=load_model_weights, learning_rate_factor=factor)
    context.sources = splits
    user_code.build(task, context)
    state = TaskState(task, float16=config.runtime.mixed_precision == "float16",
                      learning_rate_factor=factor)
  if factored and context.factored_optimizers < len(state.optimizers):
    raise UserError(f"{type(task).__name__} holds {len(state.optimizers)} optimizer(s), "
                    f"{context.factored_optimizers} made by context.optimizer(): a learning "
                    f"rate factor (train.lr_on_plateau, an Action with sets_learning_rate=True) "
                    f"scales only those; make each with context.optimizer()")
  # On an accelerator uint8 images cross to it and are scaled there (unless a
  # per-example preprocess must see them decoded first); on a CPU the host is the
  # device, and decoding in tf.data keeps the arithmetic of every source the same.
  on_accelerator = runtime.has_accelerator(strategy)
  device_decode = (batching.device_decoder(splits[0])
                   if not preprocessed and on_accelerator else None)
  jit_compile = runtime.jit_compile(config.runtime, strategy)
  fuse_whole_step = runtime.fuses_whole_step(config.runtime, strategy, jit_compile)
  communication_options = None if coordinator else runtime.communication_options(
      config.runtime)

  def step_context(step, tracing_only=False):
    return tasks.StepContext(
        step=step, global_batch_size=config.train.global_batch_size,
        num_replicas=strategy.num_replicas_in_sync, seed=config.runtime.seed,
        loss_scales=state.loss_scales, clip_norm=config.train.clip_grad_norm,
        communication_options=communication_options,
        jit_compile=jit_compile and not fuse_whole_step, fused_kernels=not jit_compile,
        tracing_only=tracing_only,
        per_example_randomness=config.runtime.deterministic and not coordinator)

  train_sums, eval_sums = _traced_sums(config, strategy, coordinator, task, state,
                                       step_context, (features_spec, labels_spec),
                                       fuse_whole_step, training=not read_only)
  for field, metric, used in (
      ("checkpoint.best_metric", config.checkpoint.best_metric,
       config.checkpoint.keep_best or config.checkpoint.early_stop_patience),
      ("train.lr_on_plateau.metric", config.train.lr_on_plateau.metric,
       config.train.lr_on_plateau.factor)):
    if used and not read_only and metric not in eval_sums.names:
      raise UserError(f"{field}={metric!r} is not reported by the eval step (choose from: "
                      f"{', '.join(eval_sums.names) or 'none: the task has no eval_step'})")
  if read_only:  # eval, continuous_eval, predict, export: no train step traced or compiled
    return Assembly(state, train_sums, eval_sums, None, device_decode, on_accelerator)
  replica_step = steps.make_replica_step(task, train_sums, step_context, decode=device_decode,
                                         fuse_whole_step=fuse_whole_step)
  if coordinator:
    train_loop = steps.make_parameter_server_train_loop(
        coordinator, replica_step, train_sums, state.all_variables(),
        num_workers=runtime.num_workers(strategy), learning_rates=state.learning_rate_vector)
  else:
    train_loop = steps.make_train_loop(strategy, replica_step, train_sums, state.all_variables(),
                                       state.model_variables.values(),
                                       learning_rates=state.learning_rate_vector)
  return Assembly(state, train_sums, eval_sums, train_loop, device_decode, on_accelerator)



def train_state(config, model_dir: str, task: Task, state: TaskState, strategy, *, agreement,
                is_chief: bool, read_only: bool) -> TrainState:
  """The checkpoints of `state` in model_dir, knowing what fixes the run (the task, the
  fields that may change), the shape that trains and what makes the task's trajectory
  depend on it (an elastic resume is judged by them); a restore sets the learning rate
  factor its step saved."""
  return TrainState(
      config, model_dir, model_variables=state.model_variables,
      optimizer_variables=state.optimizer_variables, agreement=agreement, is_chief=is_chief,
      read_only=read_only, task_name=f"{type(task).__module__}:{type(task).__qualname__}",
      may_change=run_fields.may_change(task, config.to_dict()),
      shape=elastic.shape(replicas=strategy.num_replicas_in_sync,
                          workers=runtime.num_workers(strategy),
                          strategy=config.runtime.strategy),
      replica_dependence=state.replica_dependence(config.runtime.deterministic),
      strategy_dependence=state.strategy_dependence(config.runtime.deterministic),
      on_restore=learning_rate.restored(state.learning_rate_factor))

def _traced_sums(config, strategy, coordinator, task, state, step_context, batch_spec,
                 fuse_whole_step, *, training: bool) -> tuple[steps.Sums, steps.Sums]:
  """What the train and eval steps return, by name: each traced once, nothing runs. A
  mode that does not train traces the eval step alone (its train sums name nothing)."""
  replica_batch = config.train.global_batch_size // (
      1 if coordinator else strategy.num_replicas_in_sync)
  train_spec = tf.nest.map_structure(
      lambda s: tf.TensorSpec([replica_batch, *s.shape[1:]], s.dtype), batch_spec)

  def traced_train_step(batch):
    context_ = step_context(tf.constant(0, tf.int64), tracing_only=True)
    return (context_.call(autograph_scope.user_function(task.train_step), batch),
            context_.gradient_norms)

  with strategy.scope():
    replicas = None if coordinator else strategy  # the coordinator reads the servers
    train_names, norms, train_scalars = user_code.traced(lambda: steps.discover(
        traced_train_step, train_spec, "train_step", replicas, state.check_step,
        lengths_must_be_static=fuse_whole_step), task) if training else ([], {}, [])
    eval_names, _, _ = user_code.traced(lambda: steps.discover(  # a static batch: lengths checked
        lambda batch: (autograph_scope.user_function(task.eval_step)(batch), {}), train_spec,
        "eval_step", replicas, state.check_step), task)
  # A per-step scalar must be the same on every replica: checked once per loop where
  # there are several (distloop's own task's only scalar, model.losses of the mirrored
  # weights, is by construction; its runs pay nothing).
  checked = (train_scalars if strategy.num_replicas_in_sync > 1 and not coordinator
             and not type(task).__module__.startswith("trainer.") else [])
  train_sums = steps.Sums(train_names, list(norms) if config.train.report_gradient_norm else [],
                          checked=checked)
  return train_sums, steps.Sums(eval_names, what="eval_step")


def eval_pass(config, strategy, coordinator, task, eval_sums: steps.Sums, eval_source, *,
              on_accelerator: bool) -> Callable:
  """The compiled pass over every eval example (`eval_pass() -> totals`): each worker
  reads only its replicas' slices of every eval batch."""
  decode = batching.device_decoder(eval_source) if on_accelerator else None

  def dataset(input_context=None):
    return batching.eval_dataset(eval_source, global_batch_size=config.eval.global_batch_size,
                                 input_context=input_context,
                                 decode_on_device=decode is not None)
  if coordinator:
    return steps.make_eval_pass(None, task, eval_sums, dataset(), decode)
  return steps.make_eval_pass(strategy, task, eval_sums,
                              strategy.distribute_datasets_from_function(dataset), decode)


def describe(config, strategy, task: Task, state: TaskState, step: int) -> list[str]:
  """Logs what trains, on what and where, as the run starts at `step`; returns the
  model in words (its variables, where they live, a step's micro-batches), logged too
  and TensorBoard's text."""
  if getattr(task, "num_classes_from", None):  # the built-in task resolved it
    logging.info("model.num_classes=%d, from the data (%s)", task.model_config.num_classes,
                 task.num_classes_from)
  threads = runtime.threads_per_op()
  logging.info("Training %s on %s with %d replica(s) (%s, %s CPU kernels%s) from step %d to "
               "%d.", f"train.task={config.train.task}" if config.train.task
               else config.model.name, config.data.name, strategy.num_replicas_in_sync,
               config.runtime.strategy, runtime.cpu_kernels(),
               f", {threads} thread(s) per op" if threads else "", step, config.train.steps)
  lines = state.describe()
  lines += sharding.placement({**state.model_variables, **state.optimizer_variables})
  accumulation, batch_size = config.train.accumulation_steps, config.train.global_batch_size
  if accumulation > 1:
    micro = batch_size // strategy.num_replicas_in_sync // accumulation
    lines.append(f"each step: {accumulation} micro-batches of {micro} per replica, gradients "
                 f"summed, one reduction (global batch {batch_size})")
  for line in lines:
    logging.info("%s", line)
  return lines
