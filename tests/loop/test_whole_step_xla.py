"""runtime.jit_compile: the whole step under XLA keeps the guarantees.

One replica of the default or one_device strategy compiles forward, backward and
update as one cluster; MirroredStrategy and several replicas compile the update
per device around the one all-reduce. Both must train the
weights of the plain path, with plain SGD (whose update scales with the
gradient, so a double reduction would show), on 1 and 2 replicas. Each
configuration in its own process.
"""
import json
import types
from unittest import mock

import ml_collections
import pytest

from tests.support.cli import run_python, run_trainer, train_ok
from tests.support.processes import assert_same_state, checkpoint_arrays

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


@pytest.mark.parametrize("strategy,replicas", [
    ("default", 1),  # the whole step, update included, one XLA cluster
    ("mirrored", 1),  # the update compiled apart, as on several replicas
    pytest.param("mirrored", 2, marks=pytest.mark.slow)])
def test_xla_step_trains_the_weights_of_the_plain_step(plain_one_replica, tmp_path, strategy,
                                                       replicas):
  summary = train_ok(tmp_path, *_SGD, "--config.runtime.jit_compile=true",
                     f"--config.runtime.strategy={strategy}",
                     f"--config.runtime.num_cpu_devices={replicas}")
  assert (summary["strategy"], summary["num_replicas"]) == (strategy, replicas)
  # XLA fuses and reorders float math (and runs without deterministic kernels here): the
  # weights agree to ~1e-5; a gradient counted twice would be off by 1e-2 or more.
  assert_same_state(_model_weights(tmp_path), plain_one_replica, atol=1e-4)


@pytest.mark.slow
def test_embeddings_at_a_batch_of_more_rows_than_one_read_train_alike_under_xla(tmp_path):
  """--config=recommender (Embedding gradients, batch 2048: more rows than one read of the
  pipeline) failed its first step under jit_compile=true (exit 1, "tf2xla conversion
  failed": its batches had no static size, so the step checked its values' lengths as it
  ran, with a string op XLA cannot compile). Now it trains as without XLA."""
  flags = ["--config=recommender", "--config.runtime.strategy=default",
           "--config.runtime.variable_partitioner=", "--config.train.steps=20",
           "--config.train.steps_per_loop=10", "--config.data.num_train_examples=100000",
           "--config.data.num_eval_examples=2048"]
  plain = train_ok(tmp_path / "plain", *flags, "--config.runtime.jit_compile=false")
  xla = train_ok(tmp_path / "xla", *flags, "--config.runtime.jit_compile=true")
  assert xla["eval_loss"] == pytest.approx(plain["eval_loss"], abs=1e-4)
  assert xla["eval_accuracy"] == pytest.approx(plain["eval_accuracy"], abs=1e-3)


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


def test_one_gpu_under_mirrored_trains_with_xla(tmp_path):
  """Seen on an H100: MirroredStrategy over one GPU refused the update's merge_call inside
  the whole-step XLA cluster (RuntimeError, every run of runtime.strategy=mirrored there).
  Here its two GPU checks are told every CPU device is a GPU, in a process of its own."""
  summary = run_python(f"""
from tensorflow.python.distribute import mirrored_run, mirrored_strategy
mirrored_strategy._is_gpu_device = mirrored_run._is_gpu_device = lambda device: True
import json, configs, trainer
config = configs.get("synthetic")
config.unlock()
config.train.steps, config.train.steps_per_loop = 4, 2
config.data.num_train_examples, config.data.num_eval_examples = 256, 128
config.runtime.strategy, config.runtime.num_cpu_devices = "mirrored", 1
config.runtime.jit_compile = "true"
print(json.dumps(trainer.run(config, {str(tmp_path)!r})))
""")
  assert json.loads(summary.splitlines()[-1])["step"] == 4


@pytest.mark.parametrize("name", ["parameter_server", "central_storage"])
def test_where_variables_live_off_the_compute_device_auto_is_off_and_true_refused(
    monkeypatch, name):
  """Seen on an H100: under auto the steps compiled with XLA, which cannot read a variable
  kept on another device (a parameter server; the CPU under central_storage): every step
  failed. auto is off there, and true is refused in one line."""
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  from trainer.cluster import runtime  # pylint: disable=import-outside-toplevel
  from trainer.errors import UserError  # pylint: disable=import-outside-toplevel
  monkeypatch.setattr(runtime, "has_accelerator", lambda strategy: True)
  kind = {"parameter_server": tf.distribute.experimental.ParameterServerStrategy,
          "central_storage": tf.distribute.experimental.CentralStorageStrategy}[name]
  strategy = mock.create_autospec(kind, instance=True)
  assert runtime.jit_compile(_runtime_config(), tf.distribute.get_strategy()) is True  # a GPU
  assert runtime.jit_compile(_runtime_config(), strategy) is False
  assert runtime.jit_compile(_runtime_config(jit_compile="false"), strategy) is False
  with pytest.raises(UserError, match=rf"^runtime.jit_compile=true cannot run under the "
                     rf"{name} strategy: .*; set runtime.jit_compile=auto or false$"):
    runtime.jit_compile(_runtime_config(jit_compile="true"), strategy)


def test_the_whole_step_is_one_cluster_only_for_one_replica_of_default_or_one_device():
  """The fused step is faster where it can run, and fails where it cannot (mirrored on a
  GPU, variables on another device): the rule, field by field."""
  from trainer.cluster import runtime  # pylint: disable=import-outside-toplevel
  def fuses(name, replicas=1, jit=True):
    return runtime.fuses_whole_step(ml_collections.ConfigDict({"strategy": name}),
                                    types.SimpleNamespace(num_replicas_in_sync=replicas), jit)
  assert fuses("default") and fuses("one_device")
  assert not fuses("default", jit=False)
  for name in ("mirrored", "multi_worker_mirrored", "parameter_server", "central_storage"):
    assert not fuses(name), name
  assert not fuses("mirrored", replicas=2)
