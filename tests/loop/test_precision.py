"""runtime.mixed_precision and runtime.jit_compile train correctly; the float16 loss
scale follows its policy (overflowing steps skipped on every replica, the scale halved)
and is checkpointed with the optimizer."""
import json
import math

import pytest

from tests.support.cli import run_trainer, train_ok
from tests.support.processes import checkpoint_arrays

pytestmark = pytest.mark.slow  # python -m pytest -m slow (CI runs these too)

_FLAGS = ["--config=synthetic", "--config.train.steps=200", "--config.data.num_train_examples=4000"]


@pytest.mark.parametrize("flags", [
    ["--config.runtime.mixed_precision=bfloat16"],
    ["--config.runtime.jit_compile=true"],
], ids=["bfloat16", "xla"])
def test_trains_to_the_default_accuracy(tmp_path, flags):
  summary = train_ok(tmp_path, *_FLAGS, *flags)
  assert summary["eval_accuracy"] >= 0.95


def test_float16_skips_overflowing_steps_on_every_replica_and_checkpoints_its_scale(tmp_path):
  """tests/plugins/faults.py's large_loss makes float16 gradients overflow at the initial scale
  (2**15): each overflowing step is skipped (no update: the optimizer's step count stays)
  and halves the scale, on both replicas alike, and training still learns. float16 runs
  slow on these CPUs (no float16 kernels): a small CNN (8 filters, 16 units, Adam 3e-3), 60 steps,
  a 500-example eval."""
  steps = 60
  flags = ["--config=synthetic", f"--config.train.steps={steps}",
           "--config.model.conv_filters=8", "--config.model.dense_units=16",
           "--config.train.learning_rate=0.003",
           "--config.data.num_train_examples=4000", "--config.data.num_eval_examples=500",
           "--config.runtime.mixed_precision=float16",
           "--config.train.loss=tests.plugins.faults:large_loss"]
  summary = train_ok(tmp_path, *flags, "--config.runtime.strategy=mirrored",
                     "--config.runtime.num_cpu_devices=2")
  assert summary["eval_accuracy"] >= 0.8
  arrays = checkpoint_arrays(tmp_path, steps)
  halvings = math.log2(2.0 ** 15 / float(arrays["optimizer/loss_scale/adam/scale"]))
  assert halvings >= 1 and halvings.is_integer()  # no growth: 60 steps < growth_interval
  assert int(arrays["optimizer/adam/iteration"]) == steps - halvings  # skipped, not applied
  assert arrays["model/mnist_cnn/conv/kernel"].dtype.name == "float32"  # float32 variables
  # Had one replica applied an overflowing step, its copy of the weights would be Inf/NaN
  # or differ: the run's eval (both copies) equals one replica's eval of the checkpoint.
  result = run_trainer(tmp_path, *flags, "--mode=eval")
  assert result.returncode == 0, result.stderr[-3000:]
  assert json.loads(result.stdout.strip().splitlines()[-1])["loss"] == pytest.approx(
      summary["eval_loss"], rel=1e-3)


def test_loss_scale_halves_on_overflow_and_grows_after_finite_steps():
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from trainer.task.loss_scale import DynamicLossScale  # pylint: disable=g-import-not-at-top
  loss_scale = DynamicLossScale(initial_scale=8.0, growth_interval=3)
  grads, finite = loss_scale.unscale([tf.constant([16.0, np.inf])])
  assert not bool(finite)
  loss_scale.after_non_finite_step()
  assert float(loss_scale.scale) == 4.0
  grads, finite = loss_scale.unscale([tf.constant([16.0, 8.0])])
  assert bool(finite) and grads[0].numpy().tolist() == [4.0, 2.0]
  for _ in range(3):
    loss_scale.after_finite_step()
  assert float(loss_scale.scale) == 8.0 and int(loss_scale.finite_steps) == 0
