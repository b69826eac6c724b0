"""A user's Task (examples/gan.py, examples/distillation.py) keeps every guarantee of the
built-in step: one reduction per optimizer (same weights on 1, 2, 3 replicas with plain
SGD), exact resume after SIGTERM with the task's noise, checkpointed state, export; and
a Task that breaks the contract is refused in one line."""
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from tests.support.cli import REPO, run_trainer, train_ok, user_environment
from tests.support.processes import assert_same_state, checkpoint_arrays

_GAN = os.path.join(REPO, "examples", "gan.py")
_DISTILL = os.path.join(REPO, "examples", "distillation.py")
_BAD = os.path.join(REPO, "tests", "plugins", "task_plugins.py")


def _outside(tmp_path, example: str) -> str:
  """The example copied to a folder outside the repo: a user's own file."""
  folder = tmp_path / "my_project"
  folder.mkdir(exist_ok=True)
  return shutil.copy(example, folder)


def _gan_flags(gan: str, replicas: int, *extra: str) -> list[str]:
  return [f"--config={gan}", f"--config.runtime.num_cpu_devices={replicas}",
          "--config.runtime.strategy=mirrored", "--config.runtime.deterministic=true",
          "--config.train.global_batch_size=48", "--config.data.num_train_examples=960",
          "--config.data.num_eval_examples=96", *extra]


@pytest.mark.slow  # several processes of 1-3 replicas (CI runs it)
def test_gan_weights_agree_on_1_2_3_replicas_with_plain_sgd(tmp_path):
  """Plain SGD sees a doubled (or N-times) gradient in either optimizer; Adam would not."""
  gan = _outside(tmp_path, _GAN)
  arrays = {}
  for replicas in (1, 2, 3):
    model_dir = tmp_path / f"r{replicas}"
    summary = train_ok(model_dir, *_gan_flags(gan, replicas, "--config.train.optimizer=sgd",
                                              "--config.train.optimizer_args=",  # gan.py's Adam's
                                              "--config.train.learning_rate=0.05",
                                              "--config.train.steps=30",
                                              "--config.train.steps_per_loop=10"))
    assert summary["num_replicas"] == replicas
    arrays[replicas] = checkpoint_arrays(model_dir, 30)
  keys = arrays[1].keys()
  assert any("generator" in key for key in keys) and any("discriminator" in key for key in keys)
  assert any(key.startswith("optimizer/sgd_1/") for key in keys), sorted(keys)  # both optimizers
  moved = checkpoint_arrays(tmp_path / "r1", 30)
  assert_same_state(arrays[2], arrays[1], atol=1e-6)
  assert_same_state(arrays[3], arrays[1], atol=1e-6)
  assert moved.keys() == keys


def test_gan_from_a_folder_outside_the_repo_covers_both_modes(tmp_path):
  """Trained with the example's own config (Adam, 3,000 steps) from a user's folder, the
  exported generator's samples fall near both modes of the mixture, about half each."""
  gan = _outside(tmp_path, _GAN)
  model_dir = tmp_path / "run"
  completed = subprocess.run(
      [sys.executable, "-m", "trainer", f"--config={os.path.basename(gan)}",
       f"--model_dir={model_dir}"], cwd=os.path.dirname(gan), capture_output=True, text=True,
      env=user_environment(), timeout=600)
  assert completed.returncode == 0, completed.stderr[-3000:]
  code = ("import numpy as np, tensorflow as tf\n"
          f"served = tf.saved_model.load('{model_dir}/export/3000').signatures['serving_default']\n"
          "noise = tf.random.stateless_normal([4000, 8], [7, 7])\n"
          "np.save('samples.npy', served(noise=noise)['samples'].numpy())\n")
  subprocess.run([sys.executable, "-c", code], cwd=tmp_path, check=True, timeout=300,
                 capture_output=True, env=user_environment())
  samples = np.load(tmp_path / "samples.npy")
  left = samples[:, 0] < 0
  near_mode = np.abs(np.abs(samples[:, 0]) - 2.0) < 1.0  # within 4 stddev of x = -2 or +2
  assert 0.25 < left.mean() < 0.75, left.mean()  # both modes, neither dropped
  assert near_mode.mean() > 0.8, near_mode.mean()
  assert np.abs(samples[:, 1]).mean() < 0.6  # y stays near 0, as in the data


@pytest.mark.slow  # several processes of 1-3 replicas (CI runs it)
def test_a_tasks_own_variables_are_checkpointed_and_resume_exactly(tmp_path):
  """EMA weights and a counter the step assigns (2 replicas): 10 steps, then on to 20,
  equal the uninterrupted 20 - restored, not restarted."""
  flags = ["--config=synthetic", f"--config.train.task={_BAD}:WithEma",
           "--config.runtime.strategy=mirrored", "--config.runtime.num_cpu_devices=2",
           "--config.runtime.deterministic=true", "--config.data.num_train_examples=256",
           "--config.train.steps_per_loop=5", "--config.train.optimizer=sgd"]
  train_ok(tmp_path / "straight", *flags, "--config.train.steps=20")
  train_ok(tmp_path / "resumed", *flags, "--config.train.steps=10")
  train_ok(tmp_path / "resumed", *flags, "--config.train.steps=20")
  resumed = checkpoint_arrays(tmp_path / "resumed", 20)
  assert int(resumed["model/state/updates"]) == 20
  assert any(key.startswith("model/state/ema_0") for key in resumed), sorted(resumed)
  assert_same_state(resumed, checkpoint_arrays(tmp_path / "straight", 20), atol=1e-6)


def test_gan_under_float16_scales_each_optimizer_apart(tmp_path):
  """One dynamic loss scale per optimizer, checkpointed: an overflow in one update skips
  that update alone."""
  gan = _outside(tmp_path, _GAN)
  train_ok(tmp_path / "run", *_gan_flags(gan, 1, "--config.runtime.mixed_precision=float16",
                                         "--config.train.steps=20",
                                         "--config.train.steps_per_loop=10",
                                         "--config.runtime.deterministic=false"))
  keys = checkpoint_arrays(tmp_path / "run", 20)
  scales = sorted(key for key in keys if key.endswith("/scale"))
  assert scales == ["optimizer/loss_scale/adam/scale", "optimizer/loss_scale/adam_1/scale"]


@pytest.mark.slow
def test_distillation_keeps_the_teacher_bit_identical_and_the_student_learns(tmp_path):
  distill = _outside(tmp_path, _DISTILL)
  teacher = tmp_path / "teacher"
  train_ok(teacher, "--config=synthetic", "--config.train.steps=100")
  summary = train_ok(tmp_path / "student", f"--config={distill}",
                     f"--config.distill.teacher_dir={teacher}")
  assert summary["eval_accuracy"] >= 0.9, summary  # the student learned (MLP, 300 steps)
  assert summary["eval_teacher_accuracy"] >= 0.95, summary
  before = checkpoint_arrays(teacher, 100)
  after = checkpoint_arrays(tmp_path / "student", 300)
  teacher_keys = [key for key in before if key.startswith("model/mnist_cnn/")]
  assert teacher_keys
  for key in teacher_keys:  # bit for bit: never updated, never cast
    np.testing.assert_array_equal(after[key], before[key], err_msg=key)
  assert any(key.startswith("model/student/") for key in after)
  assert not any("mnist_cnn" in key for key in after if key.startswith("optimizer/"))


@pytest.mark.parametrize("task, fragments", [
    ("AppliesTwiceUnnamed", ["both report gradient_norm", "name="]),
    ("UnbuiltOptimizer", ["not built", "optimizer.build"]),
    ("ClippingOptimizer", ["ClippingOptimizer's optimizer 'sgd': SGD(global_clipnorm=1.0) is "
                           "not supported", "train.clip_grad_norm"]),
    ("WrongRank", ["'loss' of rank 2", "per example"]),
    ("NotADict", ["train_step returned a tensor", "dict"]),
    ("NoModel", ["holds no model or variable"]),
    ("RaisingBuild", ["RaisingBuild.build raised RuntimeError: no weights here",
                      "task_plugins.py:"]),
    ("NoGradient", ["no gradient for", "leave it out"]),
    ("FailsInStep", ["FailsInStep's step failed while tracing:", "(task_plugins.py:"]),
])
def test_a_task_breaking_the_contract_is_refused_in_one_line(tmp_path, task, fragments):
  result = run_trainer(tmp_path / "run", "--config=synthetic", f"--config.train.task={_BAD}:{task}",
                       "--config.train.steps=2", "--config.data.num_train_examples=64")
  assert result.returncode == 2, result.stderr[-3000:]
  lines = result.error_lines()
  assert len(lines) == 1 and lines[0].startswith("distloop: error: "), lines
  for fragment in fragments:
    assert fragment in lines[0], lines[0]
  assert not (tmp_path / "run").exists()  # a refused run leaves nothing behind
