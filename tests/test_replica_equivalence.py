"""Gradients are reduced exactly once: 1, 2 and 3 replicas give the same weights.

Each configuration runs in its own process (one process cannot host two
MirroredStrategies of different sizes); weights are read back with plain orbax.
"""
import numpy as np
import pytest

from tests.cli import run_python, train_ok

_COMMON = ["--config=synthetic", "--config.train.steps=30", "--config.train.global_batch_size=48",
           "--config.train.steps_per_loop=10", "--config.train.learning_rate=0.01",
           "--config.runtime.strategy=mirrored", "--config.runtime.deterministic=true"]


def _weights(model_dir):
  code = ("import numpy as np, orbax.checkpoint as ocp\n"
          f"tree = ocp.PyTreeCheckpointer().restore('{model_dir}/checkpoints/30/model')\n"
          "flat = {}\n"
          "def walk(node, path):\n"
          "  for key, value in node.items():\n"
          "    walk(value, path + '/' + key) if isinstance(value, dict) else flat.__setitem__(path + '/' + key, value)\n"
          "walk(tree, '')\n"
          f"np.savez('{model_dir}/weights.npz', **flat)\n")
  run_python(code)
  with np.load(f"{model_dir}/weights.npz") as f:
    return {key: f[key] for key in f.files}


@pytest.fixture(scope="module")
def weights_by_replicas(tmp_path_factory):
  weights = {}
  for replicas in (1, 2, 3):
    model_dir = tmp_path_factory.mktemp(f"replicas{replicas}")
    summary = train_ok(model_dir, *_COMMON, f"--config.runtime.num_cpu_devices={replicas}")
    assert summary["num_replicas"] == replicas
    weights[replicas] = _weights(model_dir)
  return weights


@pytest.mark.parametrize("replicas", [2, 3])
def test_same_weights_as_one_replica(weights_by_replicas, replicas):
  one, many = weights_by_replicas[1], weights_by_replicas[replicas]
  assert one.keys() == many.keys() and len(one) == 6
  for key in one:
    np.testing.assert_allclose(many[key], one[key], atol=1e-4, rtol=0, err_msg=key)


def test_training_moved_the_weights(weights_by_replicas):
  """Biases start at zero: guards the comparison above against a loop that never updates."""
  assert np.abs(weights_by_replicas[1]["/mnist_cnn/logits/bias"]).max() > 1e-3
