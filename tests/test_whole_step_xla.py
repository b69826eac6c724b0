"""runtime.jit_compile: the whole step under XLA keeps the guarantees.

One replica compiles forward, backward and update as one cluster; several
compile the update per device around the one all-reduce. Both must train the
weights of the plain path, with plain SGD (whose update scales with the
gradient, so a double reduction would show), on 1 and 2 replicas. Each
configuration in its own process.
"""
import ml_collections
import pytest

from tests.cli import run_trainer, train_ok
from tests.processes import assert_same_state, checkpoint_arrays

_SGD = ["--config=synthetic", "--config.train.optimizer=sgd",
        "--config.train.learning_rate=0.02", "--config.train.steps=30",
        "--config.train.global_batch_size=48", "--config.train.steps_per_loop=10",
        "--config.runtime.strategy=mirrored"]


def _model_weights(model_dir):
  return {k: v for k, v in checkpoint_arrays(model_dir, 30).items() if k.startswith("model/")}


@pytest.fixture(scope="module")
def plain_one_replica(tmp_path_factory):
  model_dir = tmp_path_factory.mktemp("plain")
  train_ok(model_dir, *_SGD, "--config.runtime.jit_compile=false")
  return _model_weights(model_dir)


@pytest.mark.parametrize("replicas", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_xla_step_trains_the_weights_of_the_plain_step(plain_one_replica, tmp_path, replicas):
  summary = train_ok(tmp_path, *_SGD, "--config.runtime.jit_compile=true",
                     f"--config.runtime.num_cpu_devices={replicas}")
  assert summary["num_replicas"] == replicas
  # XLA fuses and reorders float math (and runs without deterministic kernels here): the
  # weights agree to ~1e-5; a gradient counted twice would be off by 1e-2 or more.
  assert_same_state(_model_weights(tmp_path), plain_one_replica, atol=1e-4)


def _runtime_config(**fields):
  config = ml_collections.ConfigDict({"jit_compile": "auto", "deterministic": False})
  config.update(fields)
  return config


def test_auto_is_off_on_a_cpu_and_the_choice_is_explicit_otherwise():
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  from trainer.cluster import runtime  # pylint: disable=import-outside-toplevel
  strategy = tf.distribute.get_strategy()
  assert runtime.jit_compile(_runtime_config(), strategy) is False  # no GPU here
  assert runtime.jit_compile(_runtime_config(jit_compile="true"), strategy) is True
  assert runtime.jit_compile(_runtime_config(jit_compile="false"), strategy) is False


def test_xla_with_deterministic_kernels_is_refused_in_one_line_when_xla_has_none(tmp_path):
  """XLA has no deterministic MaxPool gradient (TF 2.21): say so, do not crash."""
  result = run_trainer(tmp_path, "--config=synthetic", "--config.train.steps=10",
                       "--config.runtime.jit_compile=true", "--config.runtime.deterministic=true")
  assert result.returncode == 2, result.stderr[-2000:]
  errors = [line for line in result.error_lines() if line.startswith("distloop: error:")]
  assert len(errors) == 1 and "MaxPool" in errors[0] and "Traceback" not in result.stderr
  assert "set one of them to false" in result.stderr
