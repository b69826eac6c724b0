"""Checks a resolved config before anything runs or is written.

Pure Python (no TensorFlow import), so a bad value fails in a fraction of a
second with one line that names the field and the value. Checks that need the
runtime (batch divisible by the replica count) live in trainer/cluster/runtime.py.
"""
import ast
import importlib.util
import math
import os
import re

import ml_collections

import input_pipelines
from input_pipelines import padding
import models
from trainer.setup import epochs
from trainer.setup import heads
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
# runtime.intra_op_threads above the larger of this and the machine's cores is refused:
# TensorFlow starts the whole pool at once, and a count the system cannot give threads
# for (100000: pthread_create fails, EAGAIN) aborts the process in C++, whose teardown
# then hangs until killed. Not the cores alone: a deterministic job keeps its value on
# every machine it resumes on (the summation order follows it), so a smaller machine
# must not refuse it; 1024 threads start in well under a second (4096 did too, measured).
MOST_THREADS_PER_OP = 1024


def check_config(config: ml_collections.ConfigDict) -> None:
  """Raises UserError naming the first bad field (and imports the plug-ins it names)."""
  plugins.resolve("model.name", config.model.name, models.BUILTINS)  # resolves
  for field in ("model.conv_filters", "model.dense_units", "model.mlp_units",
                "model.hidden_units", "model.num_outputs"):
    _positive(config, field)
  _non_negative(config, "model.num_classes")  # 0: from the data (trainer/supervised/task.py)
  _in_range(config, "model.dropout_rate", 0.0, 1.0, high_inclusive=False)

  _positive(config, "model.embedding_dim")

  plugins.resolve("data.name", config.data.name, input_pipelines.BUILTINS)
  if config.data.preprocess:
    plugins.resolve("data.preprocess", config.data.preprocess)
  for field in ("data.num_train_examples", "data.num_eval_examples", "data.num_features",
                "data.num_users", "data.num_items",
                "data.image_size"):
    _positive(config, field)
  _in_range(config, "data.eval_fraction", 0.0, 1.0, high_inclusive=False)
  _one_of(config, "data.channels", (1, 3))
  try:
    padding.parse(config.data.pad_to)
  except ValueError as e:
    raise UserError(f"data.pad_to={config.data.pad_to!r} {e}") from None
  _number(config, "data.pad_value")
  _non_negative(config, "data.bucket_window")

  if config.train.task:
    plugins.resolve("train.task", config.train.task)
  for spec in [part.strip() for part in config.train.actions.split(",") if part.strip()]:
    plugins.resolve("train.actions", spec)
  for loss in (heads.per_output("train.loss", config.train.loss) or {"": config.train.loss}
               ).values():
    plugins.resolve("train.loss", loss, dict.fromkeys(LOSSES))
  output_losses = heads.check_config(config)  # train.loss_weights too
  _one_of(config, "train.from_logits", ("auto", "true", "false"))
  _metrics(config)

  epochs.check_config(config)
  for field in (("train.global_batch_size", "train.steps_per_loop", "train.accumulation_steps")
                + (() if config.train.epochs else ("train.steps",))):
    _positive(config, field)
  if config.train.task and config.train.accumulation_steps != 1:
    raise UserError(f"train.accumulation_steps={config.train.accumulation_steps} applies to the "
                    f"built-in step; a Task ({config.train.task}) accumulates in its own "
                    f"train_step (sum step.gradients over micro-batches, then one "
                    f"step.apply_gradients)")
  plugins.resolve("train.optimizer", config.train.optimizer, dict.fromkeys(OPTIMIZERS))
  optimizer_arguments(config.train)
  _non_negative(config, "train.weight_decay")
  _in_range(config, "train.ema_decay", 0.0, 1.0, high_inclusive=False)
  _weight_decay_exclude(config.train.weight_decay_exclude)
  _non_negative(config, "train.learning_rate")
  _in_range(config, "train.momentum", 0.0, 1.0, high_inclusive=False)
  plugins.resolve("train.lr_schedule", config.train.lr_schedule, dict.fromkeys(LR_SCHEDULES))
  _non_negative(config, "train.warmup_steps")
  if (config.train.lr_schedule == "cosine" and not config.train.epochs  # else: epochs.py
      and config.train.warmup_steps >= config.train.steps):
    raise UserError(f"train.warmup_steps={config.train.warmup_steps} must be below "
                    f"train.steps={config.train.steps}")
  _positive(config, "train.lr_decay_steps")
  _in_range(config, "train.lr_decay_rate", 0.0, 1.0)
  _non_negative(config, "train.clip_grad_norm")

  _one_of(config, "train.nonfinite_policy", NONFINITE_POLICIES)
  _non_negative(config, "train.max_rollbacks")
  _non_negative(config, "train.action_timeout_seconds")

  _non_negative(config, "eval.interval")
  _positive(config, "eval.global_batch_size")
  _positive(config, "eval.poll_seconds")
  _non_negative(config, "eval.timeout_seconds")

  _positive(config, "checkpoint.interval")
  _non_negative(config, "checkpoint.interval_seconds")
  _positive(config, "checkpoint.max_to_keep")
  _non_negative(config, "checkpoint.keep_period")
  _non_negative(config, "checkpoint.keep_best")
  _one_of(config, "checkpoint.best_mode", BEST_MODES)
  _non_negative(config, "checkpoint.early_stop_patience")
  _non_negative(config, "checkpoint.early_stop_min_delta")
  reported = ["loss", *output_losses] + [
      heads.reported_name(output, plugins.name_of(spec))
      for output, spec in heads.metric_entries(metric_specs(config.eval))]
  if ((config.checkpoint.keep_best or config.checkpoint.early_stop_patience)
      and config.checkpoint.best_metric not in reported
      and not config.train.task):  # a Task's eval names are known once it is traced
    raise UserError(f"checkpoint.best_metric={config.checkpoint.best_metric!r} is not reported "
                    f"(choose from: {', '.join(reported)})")
  # checkpoint.init_from: where it is read (trainer/state/model_dir.py check_init_from)
  if config.checkpoint.init_partial and not config.checkpoint.init_from:
    raise UserError("checkpoint.init_partial=true applies to a warm start: set "
                    "checkpoint.init_from too, or drop init_partial")
  _one_of(config, "checkpoint.if_unreadable", IF_UNREADABLE)

  _one_of(config, "runtime.strategy", STRATEGIES)
  _positive(config, "runtime.num_cpu_devices")
  _threads_per_op(config)
  _non_negative(config, "runtime.seed")
  _non_negative(config, "runtime.all_reduce_bytes_per_pack")
  _one_of(config, "runtime.all_reduce_implementation", ALL_REDUCE_IMPLEMENTATIONS)
  _in_range(config, "runtime.slurm_port_base", 1, 65535)
  _one_of(config, "runtime.mixed_precision", PRECISIONS)
  _profile_window(config.runtime.profile_steps)
  _one_of(config, "runtime.jit_compile", ("auto", "true", "false"))
  _variable_partitioner(config.runtime)
  if config.runtime.mlflow_uri and importlib.util.find_spec("mlflow") is None:
    raise UserError(f"runtime.mlflow_uri={config.runtime.mlflow_uri!r} needs the MLflow client: "
                    f"pip install -e '.[mlflow]' (or pip install mlflow-skinny)")
  if config.runtime.mlflow_uri:
    _mlflow_store(config.runtime.mlflow_uri)


_DATABASES = ("sqlite", "postgresql", "mysql", "mssql")


def _mlflow_store(uri: str) -> None:
  """A local store the installed client refuses, in one line naming what works: MLflow's
  file store is in maintenance mode (refused unless MLFLOW_ALLOW_FILE_STORE=true); a
  database needs the full `mlflow` package (mlflow-skinny has no SQLAlchemy)."""
  scheme = uri.split(":", 1)[0].split("+", 1)[0].lower() if ":" in uri else ""
  if scheme in ("file", "") or len(scheme) == 1:  # a path (or a Windows drive) is a file store
    from mlflow import environment_variables  # pylint: disable=g-import-not-at-top
    allowed = getattr(environment_variables, "MLFLOW_ALLOW_FILE_STORE", None)
    if allowed is not None and not allowed.get():
      raise UserError(f"runtime.mlflow_uri={uri!r}: MLflow's file store is in maintenance "
                      f"mode and the installed client refuses it; log locally to "
                      f"sqlite:///PATH/mlflow.db (pip install mlflow), or to a tracking "
                      f"server (mlflow server --backend-store-uri sqlite:///PATH/mlflow.db; "
                      f"runtime.mlflow_uri=http://127.0.0.1:5000), or set "
                      f"MLFLOW_ALLOW_FILE_STORE=true")
  if scheme in _DATABASES and importlib.util.find_spec("sqlalchemy") is None:
    raise UserError(f"runtime.mlflow_uri={uri!r}: a database store needs the full MLflow "
                    f"package (pip install mlflow); the mlflow-skinny client logs to a "
                    f"tracking server (http://HOST:PORT) only")


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
  if any(spec == "top_k_accuracy" for _, spec in entries):
    _positive(config, "eval.top_k")


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


def _positive(config, field):
  value = _number(config, field)
  if value <= 0:
    raise UserError(f"{field}={value!r} must be positive")


def _non_negative(config, field):
  value = _number(config, field)
  if value < 0:
    raise UserError(f"{field}={value!r} must not be negative")


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
