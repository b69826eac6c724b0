"""Where XLA does not compile the update, Adam, SGD and momentum take one fused kernel per
variable (trainer/task/optimizers.py): it must be Keras's own update, step for step, with a
learning-rate schedule too; other optimizers keep Keras's `update_step`."""
import keras
import numpy as np
import pytest
import tensorflow as tf

from trainer.task import optimizers


def _train(make_optimizer, fused: bool, monkeypatch) -> list[np.ndarray]:
  if not fused:
    monkeypatch.setattr(optimizers, "_fused_step", lambda optimizer: None)
  rng = np.random.default_rng(0)
  # One variable big enough for the fused kernel, one small enough for Keras's update.
  variables = [keras.Variable(rng.standard_normal((300, 70)).astype("float32")),
               keras.Variable(np.zeros(7, "float32"))]
  optimizer = make_optimizer()
  optimizer.build(variables)

  @tf.function
  def six_steps():
    for i in range(6):
      grads = [tf.sin(variable.value * (i + 1.0)) + 0.1 for variable in variables]
      optimizers._update(tf.distribute.get_strategy(), optimizer, grads, variables,  # pylint: disable=protected-access
                         jit_compile=False)

  six_steps()
  assert int(optimizer.iterations.numpy()) == 6
  return [variable.numpy() for variable in variables]


_SCHEDULE = keras.optimizers.schedules.ExponentialDecay(0.05, decay_steps=2, decay_rate=0.5)


@pytest.mark.parametrize("make_optimizer, tolerance", [
    (lambda: keras.optimizers.SGD(0.1), 0.0),
    (lambda: keras.optimizers.SGD(0.1, momentum=0.9), 0.0),
    (lambda: keras.optimizers.SGD(_SCHEDULE, momentum=0.9), 0.0),
    # The kernel rounds in another order: float32 rounding (a wrong bias correction or
    # an ignored schedule is off by percents).
    (lambda: keras.optimizers.Adam(0.01), 1e-5),
    (lambda: keras.optimizers.Adam(_SCHEDULE), 1e-5),
], ids=["sgd", "momentum", "momentum-schedule", "adam", "adam-schedule"])
def test_fused_kernel_is_kerass_update(make_optimizer, tolerance, monkeypatch):
  fused = _train(make_optimizer, True, monkeypatch)
  reference = _train(make_optimizer, False, monkeypatch)
  for got, want in zip(fused, reference):
    np.testing.assert_allclose(got, want, rtol=tolerance, atol=tolerance)
  start = np.random.default_rng(0).standard_normal((300, 70)).astype("float32")
  assert np.abs(fused[0] - start).max() > 1e-2  # the weights moved


@pytest.mark.parametrize("optimizer", [
    keras.optimizers.SGD(0.1, momentum=0.9, nesterov=True), keras.optimizers.Adam(amsgrad=True),
    keras.optimizers.RMSprop(), keras.optimizers.Adagrad()], ids=lambda o: type(o).__name__)
def test_other_optimizers_keep_kerass_update(optimizer):
  assert optimizers._fused_step(optimizer) is None  # pylint: disable=protected-access


@pytest.mark.parametrize("make_strategy, calls", [
    (tf.distribute.get_strategy, 0),
    (lambda: tf.distribute.experimental.CentralStorageStrategy(), 1),  # pylint: disable=unnecessary-lambda
], ids=["variables on the step's device", "central_storage"])
def test_the_update_is_one_call_only_where_the_variables_live_elsewhere(make_strategy, calls):
  """Where the variables live on the step's device the update's ops are the step's own (a
  nested call cost a tiny model 4% of its step); where they live elsewhere (central_storage,
  a parameter server) it is one function call there (op by op: 9% slower on an H100)."""
  strategy = make_strategy()
  with strategy.scope():
    variables = [keras.Variable(np.ones((300, 70), "float32")), keras.Variable(np.zeros(7, "float32"))]
    optimizer = keras.optimizers.Adam(0.01)
    optimizer.build(variables)

  @tf.function
  def step():
    optimizers._update(strategy, optimizer, [tf.ones_like(v) for v in variables], variables,  # pylint: disable=protected-access
                       jit_compile=False)

  graph = step.get_concrete_function().graph.as_graph_def()
  assert sum(node.op in ("StatefulPartitionedCall", "PartitionedCall")
             for node in graph.node) == calls
  step()
  assert int(optimizer.iterations.numpy()) == 1
  assert np.abs(variables[0].numpy() - 1.0).max() > 1e-3  # the update ran
