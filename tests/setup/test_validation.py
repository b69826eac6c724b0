"""Every config value is checked, and the error names the field."""
import importlib
import os

import pytest

import configs
from configs import synthetic
from trainer.setup import validation
from trainer.errors import UserError
from tests.support.cli import run_trainer


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
    ("runtime.intra_op_threads", -1, "runtime.intra_op_threads=-1 must not be negative"),
    ("runtime.intra_op_threads", 100_000, "runtime.intra_op_threads=100000 is above "),
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


def test_threads_per_op_beyond_the_bound_are_one_line_not_an_abort_and_a_hang(tmp_path):
  """runtime.intra_op_threads=100000 aborted in pthread_create, then hung until killed:
  refused at validation (exit 2, one line: the value, the bound, why), nothing written."""
  bound = max(1024, os.cpu_count() or 1)  # validation.MOST_THREADS_PER_OP, or the cores
  model_dir = tmp_path / "run"
  result = run_trainer(model_dir, "--config=synthetic", "--config.train.steps=2",
                       "--config.runtime.intra_op_threads=100000", timeout=120)
  assert result.returncode == 2, result.stderr[-3000:]
  assert "Traceback" not in result.stderr and "pthread" not in result.stderr, result.stderr
  assert result.error_lines() == [
      f"distloop: error: runtime.intra_op_threads=100000 is above {bound}, the most "
      f"distloop allows (the larger of 1024 and this machine's {os.cpu_count()} cores): "
      f"TensorFlow starts every one of them at once, and a count the system cannot give "
      f"aborts the process; use at most the cores, or 0 for the default"], result.stderr
  assert not model_dir.exists()


def test_threads_per_op_at_the_bound_are_valid():
  config = synthetic.get_config()
  config.runtime.intra_op_threads = max(validation.MOST_THREADS_PER_OP, os.cpu_count() or 1)
  validation.check_config(config)
