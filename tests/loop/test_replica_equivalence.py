"""Gradients are reduced exactly once: 1, 2 and 3 replicas give the same weights.

Adam's update hardly depends on the scale of the gradients (only through its
epsilon), so a gradient counted N times would pass its check by a margin of
epsilon. Plain SGD and momentum move the weights in proportion to the gradient:
with them the check is tight (1e-6) and a reduction counted twice fails by far.

Each configuration runs in its own process (one process cannot host two
MirroredStrategies of different sizes); weights are read back with plain orbax.
"""
import numpy as np
import pytest

from tests.support.cli import train_ok
from tests.support.processes import read_checkpoint

pytestmark = pytest.mark.slow  # python -m pytest -m slow (CI runs these too)

_COMMON = ["--config=synthetic", "--config.train.steps=30", "--config.train.global_batch_size=48",
           "--config.train.steps_per_loop=10", "--config.runtime.strategy=mirrored",
           "--config.runtime.deterministic=true", "--config.train.report_gradient_norm=true"]
_OPTIMIZERS = {  # name: (flags, tolerance)
    # Adam moves every weight by about the rate whatever the size of its gradient, so a
    # weight whose gradient is ~0 (a unit that hardly fires) moves by ~the rate in the
    # direction of its rounding error, which depends on the replica count (oneDNN sums a
    # batch in an order that depends on its size): a handful of such weights may differ
    # by up to the rate. A reduction missing or applied per replica moves all of them.
    "adam": (["--config.train.optimizer=adam", "--config.train.learning_rate=0.01"], 1e-4),
    # Small rates: summation order differs with the replica count (rounding, ~1e-8 per
    # step), and a large rate amplifies it along the trajectory; a gradient counted twice
    # still moves the weights by 1e-2 or more.
    "sgd": (["--config.train.optimizer=sgd", "--config.train.learning_rate=0.02"], 1e-6),
    # Momentum (0.9) steps ~10x the rate once it builds up: at 0.002 it moves about as far
    # as SGD at 0.02 (at 0.01 the rounding grew to 1.5e-5).
    "momentum": (["--config.train.optimizer=momentum", "--config.train.learning_rate=0.002"],
                 1e-6),
    # Decoupled weight decay (Keras's, kernels only): applied once per step on every replica's
    # copy, from the same weights; a decay applied per replica or per reduction fails.
    "sgd_weight_decay": (["--config.train.optimizer=sgd", "--config.train.learning_rate=0.02",
                          "--config.train.weight_decay=2.0"], 1e-6),
    # Two heads, weighted: each head's loss is divided by the global batch once, then
    # weighted; a head reduced per replica, or its weight applied twice, fails.
    "sgd_two_heads": (["--config.train.optimizer=sgd", "--config.train.learning_rate=0.02",
                       "--config.data.name=tests.plugins.multi_output_plugins:arrays",
                       "--config.model.name=tests.plugins.multi_output_plugins:two_heads",
                       "--config.train.loss=class=sparse_categorical_crossentropy,"
                       "value=mean_squared_error",
                       "--config.train.loss_weights=value=0.5",
                       "--config.eval.metrics=class=accuracy"], 1e-6),
}


def _weights(model_dir):
  return read_checkpoint(model_dir, 30, items=("model",))


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
  """weights(optimizer, replicas): the final weights of that run, trained once."""
  cache = {}

  def get(optimizer, replicas):
    if (optimizer, replicas) not in cache:
      model_dir = tmp_path_factory.mktemp(f"{optimizer}_replicas{replicas}")
      summary = train_ok(model_dir, *_COMMON, *_OPTIMIZERS[optimizer][0],
                         f"--config.runtime.num_cpu_devices={replicas}")
      assert summary["num_replicas"] == replicas
      cache[optimizer, replicas] = _weights(model_dir), _gradient_norms(model_dir)
    return cache[optimizer, replicas][0]

  def gradient_norms(optimizer, replicas):
    get(optimizer, replicas)  # trained once, as above
    return cache[optimizer, replicas][1]

  get.gradient_norms = gradient_norms
  return get


def _gradient_norms(model_dir) -> dict:
  """{step: the loop's mean gradient norm} from TensorBoard's train scalars."""
  from tensorboard.backend.event_processing import event_accumulator  # pylint: disable=import-outside-toplevel
  from tensorboard.util import tensor_util  # pylint: disable=import-outside-toplevel
  accumulator = event_accumulator.EventAccumulator(
      str(model_dir / "tensorboard" / "train"), size_guidance={event_accumulator.TENSORS: 0})
  accumulator.Reload()
  return {e.step: float(tensor_util.make_ndarray(e.tensor_proto))
          for e in accumulator.Tensors("gradient_norm")}


@pytest.mark.parametrize("replicas", [2, 3])
@pytest.mark.parametrize("optimizer", sorted(_OPTIMIZERS))
def test_same_weights_as_one_replica(weights, optimizer, replicas):
  one, many = weights(optimizer, 1), weights(optimizer, replicas)
  assert one.keys() == many.keys() and len(one) == 6
  tolerance = _OPTIMIZERS[optimizer][1]
  for key in one:
    if optimizer == "adam":  # see _OPTIMIZERS: at most 1 in 10,000 weights off by <= the rate
      off = np.abs(many[key] - one[key]) > tolerance
      assert off.mean() <= 1e-4, f"{key}: {off.sum()} of {off.size} weights differ"
      np.testing.assert_allclose(many[key], one[key], atol=0.01, rtol=0, err_msg=key)
    else:
      np.testing.assert_allclose(many[key], one[key], atol=tolerance, rtol=0, err_msg=key)


@pytest.mark.parametrize("optimizer", sorted(_OPTIMIZERS))
def test_training_moved_the_weights(weights, optimizer):
  """Biases start at zero: guards the comparison above against a loop that never updates."""
  biases = {key: value for key, value in weights(optimizer, 1).items()
            if key.endswith("/bias") and "optimizer" not in key}
  assert biases and max(np.abs(value).max() for value in biases.values()) > 1e-3, list(biases)


@pytest.mark.parametrize("replicas", [2, 3])
def test_the_reported_gradient_norm_is_the_same_on_any_replica_count(weights, replicas):
  """Every replica holds the same reduced gradients; one replica reports their norm. A norm
  counted on several replicas, or averaged over the wrong number of steps, differs from
  the one replica's by a factor."""
  one, many = weights.gradient_norms("sgd", 1), weights.gradient_norms("sgd", replicas)
  assert sorted(one) == sorted(many) == [10, 20, 30], (one, many)
  for step in one:
    assert one[step] > 0 and abs(many[step] - one[step]) <= 1e-5 * one[step], (step, one, many)


def test_weight_decay_shrank_the_kernels(weights):
  """Against plain SGD on the same data: decay 2.0 at rate 0.02 takes 4% a step off every
  kernel, so the equality above is not one of two runs that never decayed. (Biases and
  norm scales left alone: tests/loop/test_optimizers.py.)"""
  plain, decayed = weights("sgd", 1), weights("sgd_weight_decay", 1)
  kernels = [key for key in plain if key.endswith("/kernel")]
  assert len(kernels) == 3
  for key in kernels:
    ratio = np.linalg.norm(decayed[key]) / np.linalg.norm(plain[key])
    assert ratio < 0.6, (key, ratio)
