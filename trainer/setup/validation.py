"""Checks a resolved config before anything runs or is written.

`FIELDS` is the one table: every field of configs/common.py, the check it gets here and
the code that acts on it. Pure Python (no TensorFlow import), so a bad value fails in a
fraction of a second with one line that names the field and the value. Checks that need
the runtime (batch divisible by the replica count) live in trainer/cluster/runtime.py;
checkpoint.init_from, which needs its bucket staged, in trainer/store/model_dir.py.
"""
import ast
import math
import os
import re

import ml_collections

import input_pipelines
from input_pipelines import padding
import models
from trainer.setup import epochs
from trainer.setup import heads
from trainer.setup import loggers
from trainer.setup import plugins
from trainer.setup.names import LOSSES, LR_SCHEDULES, METRICS, OPTIMIZERS
from trainer.errors import UserError

STRATEGIES = ("default", "one_device", "mirrored", "multi_worker_mirrored",
              "parameter_server", "central_storage", "tpu")
ALL_REDUCE_IMPLEMENTATIONS = ("auto", "ring", "nccl")
NONFINITE_POLICIES = ("stop", "rollback")
PRECISIONS = ("float32", "bfloat16", "float16")
BEST_MODES = ("max", "min")
IF_UNREADABLE = ("stop", "start_over")
PROFILE_WORKERS = ("chief", "all")
# runtime.intra_op_threads above the larger of this and the machine's cores is refused:
# TensorFlow starts the whole pool at once, and a count the system cannot give threads
# for (100000: pthread_create fails, EAGAIN) aborts the process in C++, whose teardown
# then hangs until killed. Not the cores alone: a deterministic job keeps its value on
# every machine it resumes on (the summation order follows it), so a smaller machine
# must not refuse it; 1024 threads start in well under a second (4096 did too, measured).
MOST_THREADS_PER_OP = 1024


def check_config(config: ml_collections.ConfigDict) -> None:
  """Raises UserError naming the first bad field (and imports the plug-ins it names):
  each field of FIELDS in turn, by the check the table gives it."""
  for field, (check, _) in FIELDS.items():
    if check is not None:
      check(config, field)


def check_mode(config: ml_collections.ConfigDict, mode: str) -> None:
  """UserError for a field that follows the evals during training (early stopping,
  train.lr_on_plateau) in a mode that makes none."""
  if mode == "train" and config.checkpoint.early_stop_patience:
    raise UserError(f"checkpoint.early_stop_patience={config.checkpoint.early_stop_patience} "
                    f"needs evals during training: --mode=train_and_eval (every "
                    f"eval.interval steps)")
  if mode in ("train", "train_and_eval") and config.train.lr_on_plateau.factor and (
      mode == "train" or not config.eval.interval):
    raise UserError(f"train.lr_on_plateau.factor={config.train.lr_on_plateau.factor} needs "
                    f"evals during training: --mode=train_and_eval with eval.interval > 0 "
                    f"(--mode={mode}, eval.interval={config.eval.interval})")


# -- the checks FIELDS gives a field: each takes (config, "section.field") ---------------

def _positive(config, field):
  value = _number(config, field)
  if value <= 0:
    raise UserError(f"{field}={value!r} must be positive")


def _non_negative(config, field):
  value = _number(config, field)
  if value < 0:
    raise UserError(f"{field}={value!r} must not be negative")


def _in(low, high, high_inclusive=True):
  return lambda config, field: _in_range(config, field, low, high, high_inclusive)


def _among(choices):
  return lambda config, field: _one_of(config, field, choices)


def _plugin(builtins=None):
  """MODULE:FUNCTION or a built-in name, resolved now (an empty value: none given)."""
  def check(config, field):
    value = _get(config, field)
    if builtins is not None or value:
      plugins.resolve(field, value, builtins)
  return check


def _actions(config, field):
  for spec in [part.strip() for part in str(_get(config, field)).split(",") if part.strip()]:
    plugins.resolve(field, spec)


def _losses(config, field):
  for loss in (heads.per_output(field, config.train.loss) or {"": config.train.loss}).values():
    plugins.resolve(field, loss, dict.fromkeys(LOSSES))


def _steps(config, field):
  if not config.train.epochs:  # else the run's length comes from train.epochs (epochs.py)
    _positive(config, field)


def _accumulation(config, field):
  _positive(config, field)
  if config.train.task and config.train.accumulation_steps != 1:
    raise UserError(f"train.accumulation_steps={config.train.accumulation_steps} applies to the "
                    f"built-in step; a Task ({config.train.task}) accumulates in its own "
                    f"train_step (sum step.gradients over micro-batches, then one "
                    f"step.apply_gradients)")


def _warmup(config, field):
  _non_negative(config, field)
  if (config.train.lr_schedule == "cosine" and not config.train.epochs  # else: epochs.py
      and config.train.warmup_steps >= config.train.steps):
    raise UserError(f"train.warmup_steps={config.train.warmup_steps} must be below "
                    f"train.steps={config.train.steps}")


def _top_k(config, field):
  if any(spec == "top_k_accuracy" for _, spec in heads.metric_entries(metric_specs(config.eval))):
    _positive(config, field)


def _eval_metric(used, value_of):
  """A field naming an eval value (checkpoint.best_metric, train.lr_on_plateau.metric):
  refused when `used(config)` and the eval does not report it."""
  def check(config, field):
    reported = ["loss", *heads.check_config(config)] + [
        heads.reported_name(output, plugins.name_of(spec))
        for output, spec in heads.metric_entries(metric_specs(config.eval))]
    if (used(config) and value_of(config) not in reported
        and not config.train.task):  # a Task's eval names are known once it is traced
      raise UserError(f"{field}={value_of(config)!r} is not reported "
                      f"(choose from: {', '.join(reported)})")
  return check


def _lr_on_plateau(config, field):
  """train.lr_on_plateau.factor: 0 (off) or in (0, 1), and a combination that can act."""
  _in_range(config, field, 0.0, 1.0, False)
  settings, train = config.train.lr_on_plateau, config.train
  if not settings.factor:
    return
  if plugins.is_plugin(train.optimizer):
    raise UserError(f"{field}={settings.factor!r} scales the learning rate distloop builds; "
                    f"train.optimizer={train.optimizer!r} builds its own: use a built-in "
                    f"optimizer, or reduce the rate in your optimizer's own schedule")
  if not train.learning_rate or settings.min_lr > train.learning_rate:
    raise UserError(f"train.lr_on_plateau.min_lr={settings.min_lr!r} must not exceed "
                    f"train.learning_rate={train.learning_rate!r} (> 0), which the factor "
                    f"multiplies")


def _init_partial(config, field):
  if config.checkpoint.init_partial and not config.checkpoint.init_from:
    raise UserError(f"{field}=true applies to a warm start: set checkpoint.init_from too, or "
                    f"drop init_partial")


def _pad_to(config, field):
  try:
    padding.parse(config.data.pad_to)
  except ValueError as e:
    raise UserError(f"{field}={config.data.pad_to!r} {e}") from None


# Settings of train.optimizer_args that have a field of their own, or that live in Keras's
# apply() (which distloop does not call: trainer/task/optimizers.py).
_RESERVED_ARGUMENTS = {
    "learning_rate": "train.learning_rate (and train.lr_schedule)",
    "weight_decay": "train.weight_decay",
    "clipnorm": "train.clip_grad_norm", "global_clipnorm": "train.clip_grad_norm",
    "clipvalue": "train.clip_grad_norm", "loss_scale_factor": "runtime.mixed_precision",
}


def optimizer_arguments(train_config) -> dict:
  """train.optimizer_args ("beta_2=0.95,amsgrad=True") as keyword arguments: each value
  a Python literal, or else the text itself. UserError for a malformed entry or a setting
  that has its own field."""
  text = str(train_config.optimizer_args).strip()
  if text and plugins.is_plugin(train_config.optimizer):
    raise UserError(f"train.optimizer_args={text!r} applies to a built-in train.optimizer; "
                    f"{train_config.optimizer!r} builds its own")
  arguments = {}
  for entry in [part.strip() for part in text.split(",") if part.strip()]:
    key, equals, value = (part.strip() for part in entry.partition("="))
    if not equals or not key.isidentifier():
      raise UserError(f"train.optimizer_args={text!r}: {entry!r} is not NAME=VALUE")
    if key in _RESERVED_ARGUMENTS:
      raise UserError(f"train.optimizer_args={text!r}: set {_RESERVED_ARGUMENTS[key]} "
                      f"instead of {key}")
    try:
      arguments[key] = ast.literal_eval(value)
    except (ValueError, SyntaxError):
      arguments[key] = value
  return arguments


def _weight_decay_exclude(text: str) -> None:
  for entry in [part.strip() for part in str(text).split(",") if part.strip()]:
    if entry == "1d":
      continue
    try:
      re.compile(entry)
    except re.error as error:
      raise UserError(f"train.weight_decay_exclude={text!r}: {entry!r} is not a regular "
                      f"expression ({error})") from None


def metric_specs(eval_config) -> list[str]:
  """The entries of eval.metrics, in order (also trainer/supervised/metrics.py's list)."""
  return [name.strip() for name in str(eval_config.metrics).split(",") if name.strip()]


def _metrics(config) -> None:
  entries = heads.metric_entries(metric_specs(config.eval))
  names = [heads.reported_name(output, plugins.name_of(spec)) for output, spec in entries]
  for (output, spec), name in zip(entries, names):
    if output == "" or not spec:
      raise UserError(f"eval.metrics={config.eval.metrics!r}: write each output's metric as "
                      f"OUTPUT=METRIC")
    plugins.resolve("eval.metrics", spec, dict.fromkeys(METRICS))
    if names.count(name) > 1 or name in ("loss", "examples"):
      raise UserError(f"eval.metrics={config.eval.metrics!r}: the name {name!r} is given twice "
                      f"or is reserved")


def _get(config, field):
  value = config
  for part in field.split("."):
    value = value[part]
  return value


def _number(config, field):
  value = _get(config, field)
  if isinstance(value, bool) or not isinstance(value, (int, float)):
    raise UserError(f"{field}={value!r} must be a number")
  if math.isnan(value) or math.isinf(value):
    raise UserError(f"{field}={value!r} must be a finite number")
  return value


def _variable_partitioner(runtime) -> None:
  """runtime.variable_partitioner: its form (trainer/cluster/sharding.py), and only where
  there are parameter servers to split variables over."""
  spec = runtime.variable_partitioner
  if not spec:
    return
  if not re.fullmatch(r"(fixed|min_size|max_size):[1-9][0-9]*", spec):
    raise UserError(f"runtime.variable_partitioner={spec!r} must be \"\" (none), "
                    f"fixed:<shards>, min_size:<bytes> or max_size:<bytes> (a positive integer)")
  if runtime.strategy != "parameter_server":
    raise UserError(f"runtime.variable_partitioner={spec!r} splits variables over parameter "
                    f"servers: it needs runtime.strategy='parameter_server', not "
                    f"{runtime.strategy!r}")




def _in_range(config, field, low, high, high_inclusive=True):
  value = _number(config, field)
  above = value > high if high_inclusive else value >= high
  if value < low or above:
    bracket = "]" if high_inclusive else ")"
    raise UserError(f"{field}={value!r} must be in [{low}, {high}{bracket}")


def _threads_per_op(config) -> None:
  """runtime.intra_op_threads: 0 (the default) up to MOST_THREADS_PER_OP or the cores."""
  _non_negative(config, "runtime.intra_op_threads")
  value, cores = config.runtime.intra_op_threads, os.cpu_count() or 1
  bound = max(MOST_THREADS_PER_OP, cores)
  if value > bound:
    raise UserError(f"runtime.intra_op_threads={value!r} is above {bound}, the most distloop "
                    f"allows (the larger of {MOST_THREADS_PER_OP} and this machine's {cores} "
                    f"cores): TensorFlow starts every one of them at once, and a count the "
                    f"system cannot give aborts the process; use at most the cores, or 0 for "
                    f"the default")


def _profile_window(spec: str) -> None:
  if not spec:
    return
  parts = spec.split(",")
  if (len(parts) != 2 or not all(p.strip().isdigit() for p in parts)
      or int(parts[0]) >= int(parts[1])):
    raise UserError(f"runtime.profile_steps={spec!r} must be 'START,END' with 0 <= START < END")


def _one_of(config, field, choices):
  value = _get(config, field)
  if value not in choices:
    raise UserError(f"{field}={value!r} is unknown (choose from: {', '.join(choices)})")


_OF = lambda check: (lambda config, field: check(_get(config, field)))  # pylint: disable=unnecessary-lambda-assignment

# Every field of configs/common.py, in the order it is checked: (its check here, None where
# the code that reads it says what is wrong in one line; the code that acts on it). A
# field's reader is named so that a change to the one shows the other
# (tests/setup/test_config_fields.py: every field is here, and each file named reads it).
FIELDS = {
    "model.name": (_plugin(models.BUILTINS), "models/__init__.py"),
    "model.conv_filters": (_positive, "models/mnist_cnn.py"),
    "model.dense_units": (_positive, "models/mnist_cnn.py"),
    "model.mlp_units": (_positive, "models/mlp.py"),
    "model.hidden_units": (_positive, "models/tabular.py"),
    "model.num_outputs": (_positive, "models/tabular.py"),
    "model.num_classes": (_non_negative, "models/mnist_cnn.py"),  # 0: from the data
    "model.dropout_rate": (_in(0.0, 1.0, high_inclusive=False), "models/mlp.py"),
    "model.embedding_dim": (_positive, "models/recommender.py"),

    "data.name": (_plugin(input_pipelines.BUILTINS), "input_pipelines/__init__.py"),
    "data.preprocess": (_plugin(), "trainer/loop/preprocess.py"),
    "data.num_train_examples": (_positive, "input_pipelines/datasets/synthetic.py"),
    "data.num_eval_examples": (_positive, "input_pipelines/datasets/synthetic.py"),
    "data.num_features": (_positive, "input_pipelines/datasets/table.py"),
    "data.num_users": (_positive, "input_pipelines/datasets/recommender.py"),
    "data.num_items": (_positive, "input_pipelines/datasets/recommender.py"),
    "data.image_size": (_positive, "input_pipelines/datasets/image_folder.py"),
    "data.eval_fraction": (_in(0.0, 1.0, high_inclusive=False), "input_pipelines/datasets/table.py"),
    "data.channels": (_among((1, 3)), "input_pipelines/datasets/image_folder.py"),
    "data.pad_to": (_pad_to, "input_pipelines/padding.py"),
    "data.pad_value": (_number, "input_pipelines/padding.py"),
    "data.bucket_window": (_non_negative, "input_pipelines/padding.py"),
    "data.dir": (None, "input_pipelines/datasets/mnist.py"),  # each dataset names what is missing
    "data.label_column": (None, "input_pipelines/datasets/table.py"),

    "train.task": (_plugin(), "trainer/loop/assembly.py"),
    "train.actions": (_actions, "trainer/loop/actions.py"),
    "train.loss": (_losses, "trainer/supervised/losses.py"),
    "train.loss_weights": (lambda config, _: heads.check_config(config), "trainer/setup/heads.py"),
    "train.from_logits": (_among(("auto", "true", "false")), "trainer/supervised/probabilities.py"),
    "eval.metrics": (lambda config, _: _metrics(config), "trainer/supervised/metrics.py"),
    "train.epochs": (lambda config, _: epochs.check_config(config), "trainer/setup/epochs.py"),
    "train.global_batch_size": (_positive, "trainer/cluster/runtime.py"),
    "train.steps_per_loop": (_positive, "trainer/loop/controller.py"),
    "train.accumulation_steps": (_accumulation, "trainer/supervised/task.py"),
    "train.steps": (_steps, "trainer/loop/controller.py"),
    "train.optimizer": (lambda config, field: plugins.resolve(
        field, config.train.optimizer, dict.fromkeys(OPTIMIZERS)), "trainer/task/optimizers.py"),
    "train.optimizer_args": (lambda config, _: optimizer_arguments(config.train),
                             "trainer/task/optimizers.py"),
    "train.weight_decay": (_non_negative, "trainer/task/optimizers.py"),
    "train.ema_decay": (_in(0.0, 1.0, high_inclusive=False), "trainer/task/optimizers.py"),
    "train.ema_eval": (None, "trainer/task/optimizers.py"),
    "train.weight_decay_exclude": (_OF(lambda text: _weight_decay_exclude(text)),  # pylint: disable=unnecessary-lambda
                                   "trainer/task/optimizers.py"),
    "train.learning_rate": (_non_negative, "trainer/task/optimizers.py"),
    "train.momentum": (_in(0.0, 1.0, high_inclusive=False), "trainer/task/optimizers.py"),
    "train.lr_schedule": (lambda config, field: plugins.resolve(
        field, config.train.lr_schedule, dict.fromkeys(LR_SCHEDULES)), "trainer/task/optimizers.py"),
    "train.warmup_steps": (_warmup, "trainer/task/optimizers.py"),
    "train.lr_decay_steps": (_positive, "trainer/task/optimizers.py"),
    "train.lr_decay_rate": (_in(0.0, 1.0), "trainer/task/optimizers.py"),
    "train.lr_on_plateau.factor": (_lr_on_plateau, "trainer/loop/learning_rate.py"),
    "train.lr_on_plateau.metric": (_eval_metric(
        lambda config: config.train.lr_on_plateau.factor,
        lambda config: config.train.lr_on_plateau.metric), "trainer/loop/learning_rate.py"),
    "train.lr_on_plateau.mode": (_among(BEST_MODES), "trainer/loop/learning_rate.py"),
    "train.lr_on_plateau.patience": (_positive, "trainer/loop/learning_rate.py"),
    "train.lr_on_plateau.min_delta": (_non_negative, "trainer/loop/learning_rate.py"),
    "train.lr_on_plateau.cooldown": (_non_negative, "trainer/loop/learning_rate.py"),
    "train.lr_on_plateau.min_lr": (_non_negative, "trainer/loop/learning_rate.py"),
    "train.clip_grad_norm": (_non_negative, "trainer/task/optimizers.py"),
    "train.nonfinite_policy": (_among(NONFINITE_POLICIES), "trainer/loop/value_checks.py"),
    "train.max_rollbacks": (_non_negative, "trainer/loop/value_checks.py"),
    "train.action_timeout_seconds": (_non_negative, "trainer/loop/actions.py"),
    "train.report_gradient_norm": (None, "trainer/loop/assembly.py"),

    "eval.interval": (_non_negative, "trainer/loop/controller.py"),
    "eval.global_batch_size": (_positive, "trainer/cluster/runtime.py"),
    "eval.poll_seconds": (_positive, "trainer/loop/continuous_eval.py"),
    "eval.timeout_seconds": (_non_negative, "trainer/loop/continuous_eval.py"),
    "eval.top_k": (_top_k, "trainer/supervised/metrics.py"),

    "predict.split": (_among(("eval", "train")), "trainer/loop/predict.py"),
    "predict.output": (None, "trainer/state/predictions.py"),
    "predict.global_batch_size": (_positive, "trainer/loop/predict.py"),
    "predict.chunk_rows": (_positive, "trainer/state/predictions.py"),

    "checkpoint.interval": (_positive, "trainer/loop/controller.py"),
    "checkpoint.interval_seconds": (_non_negative, "trainer/loop/boundary.py"),
    "checkpoint.max_to_keep": (_positive, "trainer/state/train_state.py"),
    "checkpoint.keep_period": (_non_negative, "trainer/state/train_state.py"),
    "checkpoint.keep_best": (_non_negative, "trainer/state/train_state.py"),
    "checkpoint.best_mode": (_among(BEST_MODES), "trainer/state/train_state.py"),
    "checkpoint.early_stop_patience": (_non_negative, "trainer/loop/boundary.py"),
    "checkpoint.early_stop_min_delta": (_non_negative, "trainer/loop/boundary.py"),
    "checkpoint.best_metric": (_eval_metric(
        lambda config: config.checkpoint.keep_best or config.checkpoint.early_stop_patience,
        lambda config: config.checkpoint.best_metric), "trainer/state/train_state.py"),
    # Staged and read where it acts (trainer/api.py check_config calls it after these).
    "checkpoint.init_from": (None, "trainer/store/model_dir.py"),
    "checkpoint.init_partial": (_init_partial, "trainer/state/train_state.py"),
    "checkpoint.if_unreadable": (_among(IF_UNREADABLE), "trainer/state/train_state.py"),
    "checkpoint.async_save": (None, "trainer/state/train_state.py"),
    "checkpoint.allow_other_trajectory": (None, "trainer/state/elastic.py"),
    "checkpoint.lease_seconds": (_positive, "trainer/store/lease.py"),

    "runtime.strategy": (_among(STRATEGIES), "trainer/cluster/runtime.py"),
    "runtime.num_cpu_devices": (_positive, "trainer/cluster/runtime.py"),
    "runtime.intra_op_threads": (lambda config, _: _threads_per_op(config),
                                 "trainer/cluster/runtime.py"),
    "runtime.seed": (_non_negative, "trainer/cluster/runtime.py"),
    "runtime.deterministic": (None, "trainer/cluster/runtime.py"),
    "runtime.all_reduce_bytes_per_pack": (_non_negative, "trainer/cluster/runtime.py"),
    "runtime.all_reduce_implementation": (_among(ALL_REDUCE_IMPLEMENTATIONS),
                                          "trainer/cluster/runtime.py"),
    "runtime.slurm_port_base": (_in(1, 65535), "trainer/cluster/runtime.py"),
    "runtime.mixed_precision": (_among(PRECISIONS), "trainer/cluster/runtime.py"),
    "runtime.profile_steps": (_OF(lambda spec: _profile_window(spec)), "trainer/loop/profiling.py"),  # pylint: disable=unnecessary-lambda
    "runtime.jit_compile": (_among(("auto", "true", "false")), "trainer/cluster/runtime.py"),
    "runtime.variable_partitioner": (lambda config, _: _variable_partitioner(config.runtime),
                                     "trainer/cluster/sharding.py"),
    "runtime.loggers": (loggers.check_loggers, "trainer/reporters/fan_out.py"),
    "runtime.wandb_project": (None, "trainer/reporters/wandb_log.py"),
    "runtime.wandb_export": (None, "trainer/reporters/wandb_log.py"),
    "runtime.mlflow_uri": (loggers.check_mlflow, "trainer/reporters/mlflow_log.py"),
    "runtime.mlflow_experiment": (None, "trainer/reporters/mlflow_log.py"),
}
