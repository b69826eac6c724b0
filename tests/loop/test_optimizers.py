"""Any Keras optimizer by name: distloop's update (trainer/task/optimizers.py, which does not
call Keras's `apply`) must be Keras's own `apply` step for step -- weight decay, variable
constraints and Nadam's momentum product included -- and what it cannot do is refused in
one line."""
import os

import keras
import ml_collections
import numpy as np
import pytest
import tensorflow as tf

import configs
from configs import common
from trainer.errors import UserError
from trainer.state import keys
from trainer.setup import names
from trainer.task import optimizers
from trainer.setup import validation
from tests.support.cli import run_trainer, train_ok
from tests.support.processes import assert_same_state, checkpoint_arrays


def _train_config(**fields) -> ml_collections.ConfigDict:
  config = common.base_config().train
  with config.unlocked():
    config.update(fields)
  return config


def _variables(rng):
  """A kernel big enough for the fused kernels, a bias, a norm scale, a constrained kernel."""
  kernel = keras.Variable(rng.standard_normal((200, 100)).astype("float32"), name="kernel")
  bias = keras.Variable(rng.standard_normal(100).astype("float32"), name="bias")
  gamma = keras.Variable(1 + rng.standard_normal(100).astype("float32") / 10, name="gamma")
  positive = keras.Variable(np.abs(rng.standard_normal((10, 10))).astype("float32"),
                            name="positive")
  positive.constraint = keras.constraints.NonNeg()  # as Layer.add_weight(constraint=) sets it
  return [kernel, bias, gamma, positive]


def _gradients(variables, step: int):
  # Deterministic, of both signs, pushing `positive` below 0 so the constraint bites.
  return [tf.sin(variable.value * (step + 1.0)) + (0.5 if i == 3 else 0.1)
          for i, variable in enumerate(variables)]


_DECAYING = {  # train.optimizer -> (extra fields, the same optimizer built by hand)
    "adamw": ({}, lambda: keras.optimizers.AdamW(0.01)),  # Keras's default decay, 0.004
    "adam": ({"weight_decay": 0.1}, lambda: keras.optimizers.Adam(0.01, weight_decay=0.1)),
    "sgd": ({"weight_decay": 0.1}, lambda: keras.optimizers.SGD(0.01, weight_decay=0.1)),
    "momentum": ({"weight_decay": 0.1},
                 lambda: keras.optimizers.SGD(0.01, momentum=0.9, weight_decay=0.1)),
    "nadam": ({"weight_decay": 0.05}, lambda: keras.optimizers.Nadam(0.01, weight_decay=0.05)),
    "lion": ({"weight_decay": 0.1}, lambda: keras.optimizers.Lion(0.01, weight_decay=0.1)),
    "lamb": ({"weight_decay": 0.1}, lambda: keras.optimizers.Lamb(0.01, weight_decay=0.1)),
    "adafactor": ({}, lambda: keras.optimizers.Adafactor(0.01)),
    "adamax": ({"optimizer_args": "beta_2=0.99"},
               lambda: keras.optimizers.Adamax(0.01, beta_2=0.99)),
    "rmsprop": ({"weight_decay": 0.1},
                lambda: keras.optimizers.RMSprop(0.01, momentum=0.9, weight_decay=0.1)),
    "adagrad": ({}, lambda: keras.optimizers.Adagrad(0.01)),
    "adam_ema": ({"optimizer": "adam", "weight_decay": 0.1, "ema_decay": 0.9},
                 lambda: keras.optimizers.Adam(0.01, weight_decay=0.1, use_ema=True,
                                               ema_momentum=0.9)),
    "adadelta": ({"learning_rate": 1.0}, lambda: keras.optimizers.Adadelta(1.0)),
    "ftrl": ({"optimizer_args": "l1_regularization_strength=0.01"},
             lambda: keras.optimizers.Ftrl(0.01, l1_regularization_strength=0.01)),
}


@pytest.mark.parametrize("name", sorted(_DECAYING))
def test_the_update_is_keras_apply_step_for_step(name):
  """Catches: weight decay skipped or applied after the update, a constraint ignored,
  Nadam's momentum product left out (its own _backend_update_step), a fused kernel
  that is not the optimizer's formula, optimizer_args dropped."""
  fields, by_hand = _DECAYING[name]
  ours = optimizers.create(_train_config(**{"optimizer": name, "learning_rate": 0.01,
                                            **fields}))
  theirs = by_hand()
  assert type(ours) is type(theirs)
  ours_variables, their_variables = (_variables(np.random.default_rng(0)) for _ in range(2))
  ours.build(ours_variables)
  theirs.exclude_from_weight_decay(var_list=their_variables[1:3])  # distloop's default: 1d
  theirs.build(their_variables)

  @tf.function
  def our_step(step):
    optimizers.apply_reduced_gradients(tf.distribute.get_strategy(), ours,
                                       _gradients(ours_variables, step), ours_variables)

  @tf.function
  def their_step(step):
    theirs.apply(_gradients(their_variables, step), their_variables)

  for step in range(5):
    our_step(tf.constant(step, tf.float32))
    their_step(tf.constant(step, tf.float32))
    for mine, keras_own in zip(ours.variables, theirs.variables):  # averages included
      np.testing.assert_allclose(mine.numpy(), keras_own.numpy(), rtol=0, atol=1e-6,
                                 err_msg=f"{name}, {mine.name}, step {step + 1}")
    for mine, keras_own in zip(ours_variables, their_variables):
      np.testing.assert_allclose(mine.numpy(), keras_own.numpy(), rtol=0, atol=1e-6,
                                 err_msg=f"{name}, {mine.name}, step {step + 1}")
  assert (ours_variables[3].numpy() >= 0).all()  # the constraint held
  assert int(ours.iterations.numpy()) == 5


def test_the_moving_average_is_served_in_place_and_the_weights_come_back():
  """train.ema_decay: after 3 SGD steps the average is the hand-computed EMA (the first step
  copies, as Keras's); inside averaged_weights the variables hold it, after they hold the
  trained values again (training must go on from them, not from the average)."""
  optimizer = optimizers.create(_train_config(optimizer="sgd", learning_rate=0.1,
                                              ema_decay=0.5))
  variable = keras.Variable(np.array([1.0, 2.0], "float32"), name="w")
  optimizer.build([variable])
  by_hand = None
  for step in range(3):
    optimizers.apply_reduced_gradients(tf.distribute.get_strategy(), optimizer,
                                       [tf.constant([1.0, -1.0]) * (step + 1)], [variable])
    by_hand = variable.numpy() if by_hand is None else 0.5 * by_hand + 0.5 * variable.numpy()
  trained = variable.numpy()
  np.testing.assert_allclose(trained, [0.4, 2.6], rtol=1e-6)
  with optimizers.averaged_weights([optimizer]):
    np.testing.assert_allclose(variable.numpy(), by_hand, rtol=1e-6)
    assert not np.allclose(by_hand, trained)
  np.testing.assert_array_equal(variable.numpy(), trained)


@pytest.mark.parametrize("exclude, decayed", [("1d", {"kernel", "positive"}),
                                              ("", {"kernel", "bias", "gamma", "positive"}),
                                              ("1d,pos", {"kernel"}),
                                              ("ker", {"bias", "gamma", "positive"})])
def test_biases_and_norm_scales_are_not_decayed_by_default(exclude, decayed):
  """With zero gradients an SGD step is the decay alone: each decayed variable shrinks by
  exactly 1 - weight_decay * rate, each excluded one stays as it was. Catches: biases and
  normalization scales decayed (the usual AdamW mistake), an exclusion ignored."""
  optimizer = optimizers.create(_train_config(optimizer="sgd", learning_rate=0.5,
                                              weight_decay=0.2, weight_decay_exclude=exclude))
  variables = _variables(np.random.default_rng(1))
  for variable in variables:
    variable.constraint = None
  before = [variable.numpy() for variable in variables]
  optimizer.build(variables)
  optimizers.apply_reduced_gradients(tf.distribute.get_strategy(), optimizer,
                                     [tf.zeros_like(v.value) for v in variables], variables)
  for variable, old in zip(variables, before):
    factor = 0.9 if variable.name in decayed else 1.0
    np.testing.assert_allclose(variable.numpy(), old * factor, rtol=1e-6,
                               err_msg=variable.name)
  assert optimizers.describe(optimizer, variables) == (
      f"SGD(weight_decay=0.2, on {len(decayed)} of 4 variables)")


@pytest.mark.parametrize("name", names.OPTIMIZERS)
def test_every_slot_has_a_checkpoint_key_naming_its_variable(name):
  """Catches: Adafactor's factored slots (Keras names them just `kernel`, `bias`) colliding,
  or keyed after Keras's per-process numbering (Nadam's momentum product is `variable_2`
  in a process that made two variables before) instead of a stable name."""
  keras.Variable(1.0), keras.Variable(2.0)  # Keras's automatic names move on
  model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3), keras.layers.Dense(2)],
                           name="net")
  optimizer = optimizers.create(_train_config(optimizer=name))
  optimizer.build(model.trainable_variables)
  model_keys = keys.model_variables(keys.model_names([model]))
  (optimizer_name,) = keys.optimizer_names([optimizer])
  keyed = keys.optimizer_variables({optimizer_name: optimizer}, model_keys)
  slots = [key for key in keyed if key.split("/", 1)[1] not in ("iteration", "u_product")]
  assert len(slots) >= (0 if name == "sgd" else len(model_keys)), sorted(keyed)
  for key in slots:
    assert any(key.startswith(f"{optimizer_name}/{variable.replace('/', '_')}_")
               for variable in model_keys), key
  if name == "nadam":
    assert "nadam/u_product" in keyed


def test_a_learning_rate_schedule_plugin_is_called_with_the_train_config():
  config = _train_config(optimizer="sgd",
                         lr_schedule="tests.plugins.keras_plugins:halving_schedule")
  optimizer = optimizers.create(config)
  rates = [float(optimizer.learning_rate.numpy())]
  optimizer.iterations.assign(10)
  rates.append(float(optimizer.learning_rate.numpy()))
  np.testing.assert_allclose(rates, [config.learning_rate, config.learning_rate / 2],
                             rtol=1e-6)


def _overwriting_ema(unused_train_config):
  return keras.optimizers.Adam(use_ema=True, ema_overwrite_frequency=100)


def _clipped(unused_train_config):
  return keras.optimizers.SGD(clipnorm=1.0)


def _wrapped(unused_train_config):
  return keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD())


def _muon(unused_train_config):
  return keras.optimizers.Muon()


def _not_an_optimizer(unused_train_config):
  return "adam"


def _accumulating(unused_train_config):
  return keras.optimizers.SGD(gradient_accumulation_steps=4)


@pytest.mark.parametrize("fields, message", [
    ({"optimizer": "adamx"}, "train.optimizer='adamx' is unknown (choose from: sgd, momentum, "
                             "adam, adamw, adamax, nadam, rmsprop, adagrad, adadelta, adafactor, "
                             "ftrl, lamb, lion, or MODULE:FUNCTION"),
    ({"optimizer_args": "clipnorm=1.0"},
     "train.optimizer_args='clipnorm=1.0': set train.clip_grad_norm instead of clipnorm"),
    ({"optimizer_args": "weight_decay=0.1"},
     "train.optimizer_args='weight_decay=0.1': set train.weight_decay instead of weight_decay"),
    ({"optimizer_args": "beta_1"}, "train.optimizer_args='beta_1': 'beta_1' is not NAME=VALUE"),
    ({"weight_decay_exclude": "1d,(bias"},
     "train.weight_decay_exclude='1d,(bias': '(bias' is not a regular expression"),
    ({"weight_decay": -0.1}, "train.weight_decay=-0.1"),
    ({"optimizer": "tests.loop.test_optimizers:_muon", "optimizer_args": "beta_1=0.5"},
     "train.optimizer_args='beta_1=0.5' applies to a built-in train.optimizer"),
])
def test_bad_optimizer_fields_are_refused_before_anything_runs(fields, message):
  config = configs.get("synthetic")
  with config.unlocked():
    config.train.update(fields)
  with pytest.raises(UserError) as raised:
    validation.check_config(config)
  assert str(raised.value).startswith(message), str(raised.value)


@pytest.mark.parametrize("fields, message", [
    ({"optimizer_args": "betta_1=0.5"},
     "train.optimizer_args='betta_1=0.5': Adam refused them: Argument(s) not recognized"),
    ({"optimizer": "tests.loop.test_optimizers:_overwriting_ema"},
     "train.optimizer='tests.loop.test_optimizers:_overwriting_ema': "
     "Adam(ema_overwrite_frequency=100) is not supported: distloop keeps the average apart"),
    ({"optimizer": "tests.loop.test_optimizers:_clipped"},
     "train.optimizer='tests.loop.test_optimizers:_clipped': SGD(clipnorm=1.0) is not supported: "
     "set train.clip_grad_norm instead"),
    ({"optimizer": "tests.loop.test_optimizers:_accumulating"},
     "train.optimizer='tests.loop.test_optimizers:_accumulating': SGD(gradient_accumulation_steps=4) "
     "is not supported"),
    ({"optimizer": "tests.loop.test_optimizers:_wrapped"},
     "train.optimizer='tests.loop.test_optimizers:_wrapped': a LossScaleOptimizer wraps other "
     "optimizers"),
    ({"optimizer": "tests.loop.test_optimizers:_muon"},
     "train.optimizer='tests.loop.test_optimizers:_muon': Muon overrides _apply_weight_decay(), "
     "which distloop does not call"),
    ({"optimizer": "tests.loop.test_optimizers:_not_an_optimizer"},
     "train.optimizer='tests.loop.test_optimizers:_not_an_optimizer' returned str, not a "
     "keras.optimizers.Optimizer"),
    ({"lr_schedule": "tests.loop.test_optimizers:_not_an_optimizer"},
     "train.lr_schedule='tests.loop.test_optimizers:_not_an_optimizer' returned str, not a number"),
])
def test_what_keras_apply_would_do_is_refused_in_one_line(fields, message):
  """Catches: an optimizer setting that lives in Keras's apply() (which distloop does not
  call: it would all-reduce a second time) accepted and silently skipped."""
  with pytest.raises(UserError) as raised:
    optimizers.create(_train_config(**fields))
  assert str(raised.value).startswith(message), str(raised.value)
  assert "\n" not in str(raised.value)


def test_adamw_from_the_command_line_says_what_it_decays_and_fixes_its_arguments(tmp_path):
  """The start-up log names every model's parameter count and the optimizer's decay; a
  resume that changes optimizer_args (which may change the optimizer's slots) is refused
  in one line, the checkpoints left as they were."""
  flags = ["--config=synthetic", "--config.model.name=mlp", "--config.train.steps=20",
           "--config.train.steps_per_loop=10", "--config.data.num_train_examples=512",
           "--config.train.optimizer=adamw", "--config.train.optimizer_args=beta_2=0.99"]
  result = run_trainer(tmp_path, *flags)
  assert result.returncode == 0, result.stderr[-3000:]
  assert "model mlp: 101,772 parameters (101,770 trainable, 2 not)" in result.stderr
  assert "optimizer adam_w: AdamW(weight_decay=0.004, on 2 of 4 variables)" in result.stderr
  changed = run_trainer(tmp_path, *flags[:-1], "--config.train.steps=40",
                        "--config.train.optimizer_args=beta_2=0.9,amsgrad=True")
  assert changed.returncode == 2
  (line,) = changed.error_lines()
  assert line.startswith("distloop: error: train.optimizer_args="), line
  assert sorted(os.listdir(tmp_path / "checkpoints")) == ["20"]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["adamw", "nadam", "adafactor", "lion", "lamb", "ftrl"])
def test_every_kind_of_optimizer_state_resumes_exactly(tmp_path, name):
  """20 steps, then a second process to 40, equals 40 in one: every slot of the optimizer
  (Adafactor's factored ones, Nadam's momentum product, FTRL's accumulators) is checkpointed
  under a stable key and restored. Catches: a slot left out of the checkpoint or restored
  into another variable."""
  flags = ["--config=synthetic", "--config.model.name=mlp", "--config.train.steps_per_loop=10",
           "--config.data.num_train_examples=512", f"--config.train.optimizer={name}",
           "--config.train.weight_decay=0.01", "--config.runtime.deterministic=true"]
  train_ok(tmp_path / "resumed", *flags, "--config.train.steps=20")
  train_ok(tmp_path / "resumed", *flags, "--config.train.steps=40")
  train_ok(tmp_path / "whole", *flags, "--config.train.steps=40")
  whole = checkpoint_arrays(tmp_path / "whole", 40)
  assert len(whole) > 5
  assert_same_state(checkpoint_arrays(tmp_path / "resumed", 40), whole, atol=0)


@pytest.mark.slow
def test_the_moving_average_is_evaluated_and_exported_and_training_goes_on_from_the_weights(
    tmp_path):
  """train.ema_decay from the command line: the export holds the checkpoint's moving
  averages (not the trained weights, which the checkpoint keeps: a resume trains on from
  them); eval reports the average's loss (train.ema_eval=false: the weights', another
  value). Catches: the average computed but never served, served and left in place of
  the weights (training would go on from the average), or eval and export disagreeing."""
  flags = ["--config=synthetic", "--config.model.name=mlp", "--config.train.steps=20",
           "--config.train.steps_per_loop=10", "--config.data.num_train_examples=512",
           "--config.train.ema_decay=0.9", "--config.train.learning_rate=0.01"]
  summary = train_ok(tmp_path, *flags)
  state = checkpoint_arrays(tmp_path, 20)
  averages = {key: value for key, value in state.items() if key.endswith("_average")}
  kernels = [key for key in averages if "kernel" in key]
  assert len(averages) == 4 and len(kernels) == 2, sorted(state)
  reader = tf.train.load_checkpoint(str(tmp_path / "export" / "20" / "variables" / "variables"))
  exported = [reader.get_tensor(name) for name, _ in tf.train.list_variables(
      str(tmp_path / "export" / "20" / "variables" / "variables"))]
  exported = [value for value in exported if isinstance(value, np.ndarray)]
  for key in kernels:
    assert any(e.shape == averages[key].shape and np.allclose(e, averages[key], atol=1e-7)
               for e in exported), key
  raw_kernels = [value for key, value in state.items()
                 if key.startswith("model/") and key.endswith("/kernel")]
  assert len(raw_kernels) == 2
  for raw in raw_kernels:
    assert not any(e.shape == raw.shape and np.allclose(e, raw, atol=1e-7) for e in exported)
  raw_eval = run_trainer(tmp_path, *flags, "--mode=eval", "--config.train.ema_eval=false")
  assert raw_eval.returncode == 0, raw_eval.stderr[-3000:]
  averaged_eval = run_trainer(tmp_path, *flags, "--mode=eval")
  assert averaged_eval.returncode == 0, averaged_eval.stderr[-3000:]
  loss = lambda result: float(result.stderr.split("eval at step 20 | loss ")[1].split()[0])
  assert loss(averaged_eval) == pytest.approx(summary["eval_loss"], abs=1e-4)
  assert abs(loss(raw_eval) - loss(averaged_eval)) > 1e-3
