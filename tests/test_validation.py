"""Every config value is checked, and the error names the field."""
import pytest

import importlib

import configs
from configs import synthetic
from trainer.task import validation
from trainer.errors import UserError


@pytest.mark.parametrize("name", configs.NAMES)
def test_shipped_configs_are_valid(name):
  validation.check_config(importlib.import_module(f"configs.{name}").get_config())


@pytest.mark.parametrize("field, value, message", [
    ("model.name", "resnet", "model.name='resnet' is unknown"),
    ("model.dense_units", 0, "model.dense_units=0 must be positive"),
    ("model.dropout_rate", 1.0, "model.dropout_rate=1.0 must be in"),
    ("data.name", "cifar", "data.name='cifar' is unknown"),
    ("train.steps", 0, "train.steps=0 must be positive"),
    ("train.global_batch_size", -4, "train.global_batch_size=-4 must be positive"),
    ("train.steps_per_loop", 0, "train.steps_per_loop=0 must be positive"),
    ("train.optimizer", "lions", "train.optimizer='lions' is unknown"),
    ("train.from_logits", "yes", "train.from_logits='yes' is unknown (choose from: auto, true"),
    ("train.learning_rate", -0.5, "train.learning_rate=-0.5 must not be negative"),
    ("train.learning_rate", float("nan"), "must be a finite number"),
    ("eval.interval", -1, "eval.interval=-1 must not be negative"),
    ("checkpoint.interval", 0, "checkpoint.interval=0 must be positive"),
    ("checkpoint.max_to_keep", 0, "checkpoint.max_to_keep=0 must be positive"),
    ("checkpoint.interval_seconds", -60.0, "checkpoint.interval_seconds=-60.0 must not be negative"),
    ("checkpoint.interval_seconds", float("inf"), "must be a finite number"),
    ("runtime.strategy", "horovod", "runtime.strategy='horovod' is unknown"),
    ("runtime.slurm_port_base", 70000, "runtime.slurm_port_base=70000 must be in [1, 65535]"),
    ("runtime.num_cpu_devices", 0, "runtime.num_cpu_devices=0 must be positive"),
    ("runtime.all_reduce_implementation", "mpi", "is unknown"),
    ("model.embedding_dim", 0, "model.embedding_dim=0 must be positive"),
    ("data.num_users", 0, "data.num_users=0 must be positive"),
    # runtime.variable_partitioner: a form TensorFlow's partitioners cannot take, and a
    # partitioner without parameter servers (it would be silently ignored otherwise).
    ("runtime.variable_partitioner", "min_size", "min_size. must be \"\" .none., fixed:<shards>, min_size:<bytes>"),
    ("runtime.variable_partitioner", "fixed:0", "must be \"\" .none.,"),
    ("runtime.variable_partitioner", "shards:2", "must be \"\" .none.,"),
    ("runtime.variable_partitioner", "fixed:2",
     "needs runtime.strategy='parameter_server', not 'default'"),
])
def test_bad_values_are_refused_by_name(field, value, message):
  config = synthetic.get_config()
  section, name = field.split(".")
  with config.unlocked():
    config[section][name] = value
  with pytest.raises(UserError, match=message.replace("(", r"\(").replace("[", r"\[")):
    validation.check_config(config)
