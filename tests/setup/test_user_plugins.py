"""A user's own model, random-access data and metric, from a folder outside the repo.

examples/ is copied to a temp dir (not importable from the repo) and trained
through the CLI: it reaches its accuracy target; 1, 2 and 3 replicas give the
same weights with plain SGD; SIGTERM + resume ends with the uninterrupted
weights; the SavedModel, loaded in a fresh process without distloop, agrees
with eval.
"""
import importlib.util
import json
import os
import shutil

import numpy as np
import pytest

from tests.support.cli import REPO, run_python, run_trainer, train_ok
from tests.support.processes import TrainerProcess, assert_same_state, checkpoint_arrays


@pytest.fixture(scope="module")
def project(tmp_path_factory):
  """examples/ copied where nothing of the repo can import it."""
  folder = tmp_path_factory.mktemp("user_project")
  for name in ("my_project.py", "my_config.py"):
    shutil.copy(os.path.join(REPO, "examples", name), folder / name)
  return folder


def _config(project):
  return f"--config={project / 'my_config.py'}"


@pytest.fixture(scope="module")
def trained(project, tmp_path_factory):
  model_dir = tmp_path_factory.mktemp("user_trained")
  return model_dir, train_ok(model_dir, _config(project))


def test_trains_to_its_target_with_its_own_metric(trained):
  _, summary = trained
  assert summary["eval_accuracy"] >= 0.95
  assert 0.9 <= summary["eval_confident_accuracy"] <= summary["eval_accuracy"]
  assert summary["eval_examples"] == 2000


def test_eval_mode_reports_every_metric(project, trained):
  model_dir, summary = trained
  result = run_trainer(model_dir, _config(project), "--mode=eval")
  assert result.returncode == 0, result.stderr
  metrics = json.loads(result.stdout.strip().splitlines()[-1])
  assert metrics["confident_accuracy"] == pytest.approx(summary["eval_confident_accuracy"],
                                                        abs=1e-12)
  assert metrics["loss"] == pytest.approx(summary["eval_loss"], rel=1e-5)


def test_export_without_distloop_agrees_with_eval(project, trained, tmp_path):
  model_dir, summary = trained
  spec = importlib.util.spec_from_file_location("user_project_for_test", project / "my_project.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  from configs import common  # pylint: disable=import-outside-toplevel
  data_config = common.base_config().data
  data_config.num_train_examples, data_config.num_eval_examples = 20_000, 2_000
  _, eval_source = module.build_data(data_config, seed=0)
  features, labels = eval_source[np.arange(len(eval_source))]
  np.savez(tmp_path / "eval.npz", labels=labels, **features)
  step = summary["step"]
  # Any import of distloop or of the user's module fails in this process.
  code = (
      "import sys\n"
      "for name in ('trainer', 'models', 'input_pipelines', 'configs', 'my_project'):\n"
      "  sys.modules[name] = None\n"
      "import numpy as np, tensorflow as tf\n"
      f"data = np.load('{tmp_path}/eval.npz')\n"
      f"serve = tf.saved_model.load('{model_dir}/export/{step}').signatures['serving_default']\n"
      "out = serve(point=tf.constant(data['point']), polar=tf.constant(data['polar']))\n"
      "p = out['probabilities'].numpy().astype('float64')\n"
      "labels = data['labels']\n"
      "accuracy = float((p.argmax(-1) == labels).mean())\n"
      "loss = float(-np.log(p[np.arange(len(labels)), labels]).mean())\n"
      "print(accuracy, loss)\n")
  accuracy, loss = map(float, run_python(code).split())
  assert accuracy == pytest.approx(summary["eval_accuracy"], abs=1e-12)
  assert loss == pytest.approx(summary["eval_loss"], rel=1e-3, abs=1e-5)


_SGD = ["--config.train.optimizer=sgd", "--config.train.learning_rate=0.5",
        "--config.train.steps=30", "--config.train.global_batch_size=48",
        "--config.train.steps_per_loop=10", "--config.runtime.deterministic=true",
        "--config.runtime.strategy=mirrored"]


@pytest.mark.parametrize("replicas", [2, pytest.param(3, marks=pytest.mark.slow)])
def test_same_weights_on_several_replicas_with_plain_sgd(project, tmp_path, replicas):
  one = tmp_path / "one"
  many = tmp_path / "many"
  train_ok(one, _config(project), *_SGD, "--config.runtime.num_cpu_devices=1")
  train_ok(many, _config(project), *_SGD, f"--config.runtime.num_cpu_devices={replicas}")
  expected = {k: v for k, v in checkpoint_arrays(one, 30).items() if k.startswith("model/")}
  actual = {k: v for k, v in checkpoint_arrays(many, 30).items() if k.startswith("model/")}
  assert len(expected) == 6
  assert_same_state(actual, expected, atol=1e-5)
  assert np.abs(expected["model/spirals/logits/bias"]).max() > 1e-3  # training moved them


@pytest.mark.slow  # a whole training run or two: the fast suite's time (CI runs it)
def test_sigterm_then_resume_ends_with_the_uninterrupted_weights(project, tmp_path):
  flags = [_config(project), "--config.train.steps=200", "--config.train.steps_per_loop=10",
           "--config.checkpoint.interval=100", "--config.runtime.deterministic=true"]
  train_ok(tmp_path / "straight", *flags)
  interrupted = TrainerProcess(tmp_path / "stopped", *flags)
  assert interrupted.stop_at(r"step 70/200") == 42, interrupted.output[-3000:]
  stopped_at = max(int(name) for name in os.listdir(tmp_path / "stopped" / "checkpoints")
                   if name.isdigit())
  assert 70 <= stopped_at < 200 and stopped_at % 100 != 0  # mid-run, not a periodic save
  train_ok(tmp_path / "stopped", *flags)
  assert_same_state(checkpoint_arrays(tmp_path / "stopped", 200),
                    checkpoint_arrays(tmp_path / "straight", 200), atol=1e-6)


_STREAM_PROJECT = '''
import numpy as np
import tensorflow as tf

def _arrays(n, seed):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(n, 4)).astype(np.float32)
  return x, (x[:, 0] + x[:, 1] > 0).astype(np.int64)

def build_data(data_config, seed):
  train = _arrays(512, seed)
  return (lambda: tf.data.Dataset.from_tensor_slices(train)), _arrays(101, seed + 1)

def jitter(features, labels, seed):
  return features + 0.01 * tf.random.stateless_normal(tf.shape(features), seed), labels
'''


def test_a_tf_data_stream_with_preprocess_on_two_replicas(tmp_path):
  module = tmp_path / "stream_project.py"
  module.write_text(_STREAM_PROJECT)
  summary = train_ok(tmp_path / "run", "--config=synthetic", f"--config.data.name={module}:build_data",
                     f"--config.data.preprocess={module}:jitter", "--config.model.name=mlp",
                     "--config.model.num_classes=2", "--config.train.steps=40",
                     "--config.train.steps_per_loop=20", "--config.eval.global_batch_size=50",
                     "--config.runtime.strategy=mirrored", "--config.runtime.num_cpu_devices=2")
  assert summary["eval_examples"] == 101 and summary["num_replicas"] == 2
  assert summary["eval_accuracy"] > 0.8
