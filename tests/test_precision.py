"""runtime.mixed_precision and runtime.jit_compile train correctly; the float16 loss
scale follows its policy and is checkpointed with the optimizer."""
import math

import pytest

from tests.cli import train_ok
from tests.processes import checkpoint_arrays

_FLAGS = ["--config=synthetic", "--config.train.steps=200", "--config.data.num_train_examples=4000"]


@pytest.mark.parametrize("flags", [
    ["--config.runtime.mixed_precision=bfloat16"],
    ["--config.runtime.jit_compile=true"],
], ids=["bfloat16", "xla"])
def test_trains_to_the_default_accuracy(tmp_path, flags):
  summary = train_ok(tmp_path, *_FLAGS, *flags)
  assert summary["eval_accuracy"] >= 0.95


def test_float16_on_two_replicas_trains_and_checkpoints_its_loss_scale(tmp_path):
  summary = train_ok(tmp_path, *_FLAGS, "--config.runtime.mixed_precision=float16",
                     "--config.runtime.strategy=mirrored", "--config.runtime.num_cpu_devices=2")
  assert summary["eval_accuracy"] >= 0.95
  arrays = checkpoint_arrays(tmp_path, 200)
  scale = float(arrays["optimizer/loss_scale/scale"])
  assert 1.0 <= scale <= 2.0 ** 15 and math.log2(scale).is_integer()  # only ever halved or doubled
  assert arrays["model/mnist_cnn/conv/kernel"].dtype.name == "float32"  # float32 variables


def test_loss_scale_halves_on_overflow_and_grows_after_finite_steps():
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from trainer.loss_scale import DynamicLossScale  # pylint: disable=g-import-not-at-top
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
