"""What a Task's steps return, checked when they are traced (issue 31, defect 3): per
example ([batch], of the batch's length) or per step (a scalar), under a name distloop
does not report itself; and what the run writes of them is valid JSON (defect 6).
In process, through trainer.run: a refusal raises before anything is written."""
import json
import math

import keras
import numpy as np
import pytest
import tensorflow as tf

import configs
import trainer
from trainer.errors import UserError
from trainer.loop import step_values
from trainer.store import files


def _config(steps_=2, **data):
  config = configs.get("synthetic")
  config.unlock()
  config.train.steps, config.train.steps_per_loop = steps_, steps_
  config.data.num_train_examples, config.data.num_eval_examples = 128, 64
  for name, value in data.items():
    setattr(config.data, name, value)
  return config


class _Values(trainer.Task):
  """A tiny model trained on a loss; `extra(features, per_example)` adds values to the
  train step's, `eval_extra` to the eval step's."""

  def build(self, context):
    self.model = keras.Sequential([keras.Input((28, 28, 1)), keras.layers.Flatten(),
                                   keras.layers.Dense(10)])
    self.optimizer = context.optimizer(self.model.trainable_variables)

  def _loss(self, batch):
    features, labels = batch
    return keras.losses.sparse_categorical_crossentropy(labels, self.model(features),
                                                        from_logits=True)

  def extra(self, features, per_example):
    return {}

  def eval_extra(self, features, per_example):
    return {}

  def train_step(self, batch, step):
    with tf.GradientTape() as tape:
      per_example = self._loss(batch)
      loss = step.replica_loss(per_example)
    step.minimize(self.optimizer, tape, loss, self.model.trainable_variables)
    return {"loss": per_example, **self.extra(batch[0], per_example)}

  def eval_step(self, batch):
    per_example = self._loss(batch)
    return {"loss": per_example, **self.eval_extra(batch[0], per_example)}


def _task(train=None, evaluate=None):
  task = _Values()
  if train is not None:
    task.extra = train
  if evaluate is not None:
    task.eval_extra = evaluate
  return task


# -- the contract, at trace time --------------------------------------------------------

@pytest.mark.parametrize("name", ["examples", "step", "learning_rate", "learning_rate_g",
                                  "gradient_norm", "generator_gradient_norm", "examples_per_sec",
                                  "steps_per_sec", "time_sec", "epoch"])
def test_a_name_distloop_reports_itself_is_refused_listing_the_reserved_ones(name):
  """Caught: a Task's `learning_rate`, `examples`, `gradient_norm` were overwritten by
  distloop's own in metrics.csv, TensorBoard and summary.json, without a word."""
  with pytest.raises(UserError) as refused:
    step_values.check_values("train_step", {"loss": tf.zeros([4]), name: tf.constant(1.0)}, 4)
  assert f"train_step returned {name!r}, a name distloop reports itself" in str(refused.value)
  assert "reserved: examples, step, examples_per_sec" in str(refused.value)


def test_per_example_values_and_scalars_pass():
  values = {"loss": tf.zeros([4]), "penalty": tf.constant(0.5), "learning_rate_warmup": 1.0}
  with pytest.raises(UserError):  # the pattern learning_rate_*
    step_values.check_values("train_step", values, 4)
  del values["learning_rate_warmup"]
  assert step_values.check_values("train_step", values, 4) is values
  assert step_values.check_values("eval_step", {"my_examples": tf.zeros([4])}, None)


def test_a_rank_1_value_not_per_example_is_refused_when_traced(tmp_path):
  """Caught: tf.ones([3]) on a batch of 64 was accepted and reported as a 'mean'."""
  task = _task(train=lambda features, per_example: {"confusion": tf.ones([3])})
  with pytest.raises(UserError, match=r"train_step returned 'confusion' of length 3 on a "
                                      r"batch of 64 examples: values are per example"):
    trainer.run(_config(), str(tmp_path / "run"), task=task)
  assert not (tmp_path / "run").exists()  # refused before anything is written


def test_an_eval_value_not_per_example_is_refused_when_traced(tmp_path):
  task = _task(evaluate=lambda features, per_example: {"first_rows": per_example[:5]})
  with pytest.raises(UserError, match=r"eval_step returned 'first_rows' of length 5 on a "
                                      r"batch of 64 examples"):
    trainer.run(_config(), str(tmp_path / "run"), task=task)
  assert not (tmp_path / "run").exists()


def test_a_reserved_name_is_refused_before_anything_is_written(tmp_path):
  task = _task(train=lambda features, per_example: {"learning_rate": tf.constant(0.5)})
  with pytest.raises(UserError, match=r"train_step returned 'learning_rate', a name distloop "
                                      r"reports itself; rename it \(reserved: "):
    trainer.run(_config(), str(tmp_path / "run"), task=task)
  assert not (tmp_path / "run").exists()


def test_a_length_known_only_when_the_step_runs_is_checked_then_in_one_line(tmp_path):
  """A value whose length the trace cannot tell (a boolean mask) is checked as it runs."""
  def kept(features, per_example):
    return {"confident": tf.boolean_mask(per_example, per_example < 1e9)[:-1]}
  with pytest.raises(UserError) as refused:
    trainer.run(_config(), str(tmp_path / "run"), task=_task(train=kept))
  assert str(refused.value) == ("train_step returned 'confident' of length 63 on a batch of 64 "
                                "examples: values are per example (shape [batch]) or per "
                                "step (a scalar)")


def test_a_length_unknown_when_traced_is_refused_under_whole_step_xla(tmp_path):
  """One XLA cluster cannot hold the run-time length check (its message is a string op
  XLA does not compile): the run failed at its first step, exit 1, blaming the task's
  train_step with "tf2xla conversion failed". Now refused before anything is written."""
  def kept(features, per_example):
    return {"confident": tf.boolean_mask(per_example, per_example < 1e9)}
  config = _config()
  config.runtime.jit_compile = "true"
  with pytest.raises(UserError, match=r"train_step returned 'confident' of a length unknown "
                                      r"when traced: with the whole step under XLA "):
    trainer.run(config, str(tmp_path / "run"), task=_task(train=kept))
  assert not (tmp_path / "run").exists()


# -- empty streams and non-finite values (defect 6) -------------------------------------

_STREAMS = "tests/plugins/stream_plugins.py"


@pytest.mark.parametrize("split", ["eval", "train"])
def test_an_empty_stream_split_is_refused_before_anything_is_written(tmp_path, split):
  """Caught: an empty tf.data eval stream reported eval_loss 0.0 and exited 0; an empty
  train stream was a StopIteration traceback (an empty in-memory split was refused)."""
  import input_pipelines  # pylint: disable=g-import-not-at-top
  config = _config(name=f"{_STREAMS}:empty_{split}_stream")
  with pytest.raises(input_pipelines.DataError) as refused:
    trainer.run(config, str(tmp_path / "run"), mode="train_and_eval")
  assert str(refused.value) == (f"data.name='{_STREAMS}:empty_{split}_stream' {split} split: "
                                f"the split is empty (the dataset yields no example)")
  assert not (tmp_path / "run").exists()


def test_a_non_finite_eval_value_is_null_in_summary_json_and_said_in_the_log(tmp_path, caplog):
  """Caught: an eval step returning NaN wrote bare NaN into summary.json (not JSON)."""
  def nan(features, per_example):
    return {"broken": per_example * math.nan}
  summary = trainer.run(_config(), str(tmp_path), task=_task(evaluate=nan))
  assert math.isnan(summary["eval_broken"])  # the Python result holds what was computed
  def refuse(constant):
    raise AssertionError(f"summary.json holds {constant}: not JSON")
  with open(tmp_path / "summary.json") as f:
    written = json.load(f, parse_constant=refuse)
  assert written["eval_broken"] is None and written["eval_loss"] > 0
  assert "summary.json: eval_broken is nan (not finite); written as null" in caplog.text


def test_every_json_file_is_strict_json():
  text = files.json_text({"a": float("inf"), "b": [1.0, float("nan")], "c": {"d": -math.inf},
                           "e": np.float64(2.5).item()}, "x.json")
  assert json.loads(text) == {"a": None, "b": [1.0, None], "c": {"d": None}, "e": 2.5}
