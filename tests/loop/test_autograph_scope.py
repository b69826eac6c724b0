"""AutoGraph converts the user's code and leaves distloop's own as written
(input_pipelines/autograph_scope.py): a Task's steps, a loss plug-in and a data.preprocess
that branch and loop on tensors in plain Python train as in the user's own tf.function,
while no function of distloop's step machinery is converted (converting it was half of a
short run's start-up: docs/performance.md, "Start-up")."""
import contextlib
import importlib

from tensorflow.python.autograph.impl import api as autograph_api  # pylint: disable=g-direct-tensorflow-import

import configs
import trainer

# distloop's modules whose functions run inside every step: never converted.
_STEP_MACHINERY = ("trainer.task.contexts", "trainer.task.optimizers", "trainer.supervised.task",
                   "trainer.task.sparse_gradients", "trainer.cluster", "input_pipelines")


@contextlib.contextmanager
def _conversions():
  """The qualified names of the functions AutoGraph converts inside the block."""
  converted, convert = [], autograph_api._convert_actual  # pylint: disable=protected-access

  def recording(entity, program_ctx):
    converted.append(f"{getattr(entity, '__module__', '?')}.{getattr(entity, '__qualname__', '?')}")
    return convert(entity, program_ctx)

  autograph_api._convert_actual = recording  # pylint: disable=protected-access
  try:
    yield converted
  finally:
    autograph_api._convert_actual = convert  # pylint: disable=protected-access


def _config(**fields):
  config = configs.get("synthetic")
  config.unlock()
  config.train.steps, config.train.steps_per_loop = 4, 2
  config.data.num_train_examples, config.data.num_eval_examples = 256, 128
  for name, value in fields.items():
    section, field = name.split("__")
    config[section][field] = value
  return config


def _distloop_machinery(converted):
  return [name for name in converted if name.startswith(_STEP_MACHINERY)]


def test_a_tasks_steps_branch_on_tensors_and_distloop_code_stays_unconverted(tmp_path):
  with _conversions() as converted:
    summary = trainer.run(_config(train__task="tests.plugins.autograph_plugins:BranchingTask"),
                          str(tmp_path / "task"))
  assert summary["step"] == 4 and summary["eval_loss"] > 0
  assert "tests.plugins.autograph_plugins.BranchingTask.train_step" in converted, converted
  assert "tests.plugins.autograph_plugins.BranchingTask.eval_step" in converted, converted
  assert not _distloop_machinery(converted), _distloop_machinery(converted)


def test_loss_and_preprocess_plugins_branch_on_tensors(tmp_path):
  with _conversions() as converted:
    summary = trainer.run(_config(train__loss="tests.plugins.autograph_plugins:branching_loss",
                                  data__preprocess="tests.plugins.autograph_plugins:branching_preprocess"),
                          str(tmp_path / "plugins"))
  assert summary["step"] == 4 and summary["eval_loss"] > 0
  assert "tests.plugins.autograph_plugins.branching_loss" in converted, converted
  assert "tests.plugins.autograph_plugins.branching_preprocess" in converted, converted
  assert not _distloop_machinery(converted), _distloop_machinery(converted)


def test_the_step_machinery_names_real_modules():
  """The list above names modules that exist: a rename cannot make the check vacuous."""
  for module in _STEP_MACHINERY:
    importlib.import_module(module)
