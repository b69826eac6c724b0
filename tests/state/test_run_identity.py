"""The checkpoint knows its run (issue 31, defects 2 and 11): each step's meta carries
the run's identity (the fixed config fields, the Task, what is saved), and a resume,
eval or export compares against the step it restores, not only against config.json
(a copy anyone can edit). A step of another run is refused in one line and left in
place; an old step (meta without an identity) is judged by its meta's config; and a
refused resume writes nothing (config.json, config_history/)."""
import glob
import hashlib
import importlib.machinery
import json
import os
import shutil
import sys
import types

import keras
import pytest

import trainer
from configs import common
from configs import recorded
from tests.support.cli import run_trainer
from trainer.errors import UserError
from trainer.state import config_changes

_FIELDS = {"model.name": "mlp", "model.mlp_units": 8, "data.num_train_examples": 128,
           "data.num_eval_examples": 32, "train.global_batch_size": 32, "train.steps": 2,
           "train.steps_per_loop": 1}
_FLAGS = [f"--config.{field}={value}" for field, value in _FIELDS.items() if field != "train.steps"]


def _config(**changes):
  config = common.base_config()
  for field, value in {**_FIELDS, **changes}.items():
    section, name = field.split(".")
    config[section][name] = value
  return config


class TaskA(trainer.Task):
  """Two Tasks with the same variables (keys and shapes), different objectives."""

  def build(self, context):
    self.model = keras.Sequential([keras.Input((28, 28, 1)), keras.layers.Flatten(),
                                   keras.layers.Dense(10)], name="tiny")
    self.optimizer = context.optimizer(self.model.trainable_variables)

  def _per_example(self, batch):
    features, labels = batch
    return keras.losses.sparse_categorical_crossentropy(labels, self.model(features),
                                                        from_logits=True)

  def train_step(self, batch, step):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    with tf.GradientTape() as tape:
      per_example = self._per_example(batch)
      loss = step.replica_loss(per_example)
    step.minimize(self.optimizer, tape, loss, self.model.trainable_variables)
    return {"loss": per_example}

  def eval_step(self, batch):
    return {"loss": self._per_example(batch)}


class TaskB(TaskA):

  def _per_example(self, batch):
    return -super()._per_example(batch)


def _train(model_dir, config=None, **kwargs):
  return trainer.run(config or _config(), str(model_dir), **kwargs)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  """Trained model_dirs (2 steps): the run, and runs it must never take a step from."""
  root = tmp_path_factory.mktemp("runs")
  _train(root / "run")
  _train(root / "seed1", _config(**{"runtime.seed": 1}))
  _train(root / "dropout", _config(**{"model.dropout_rate": 0.5}))
  return root


@pytest.fixture
def model_dir(runs, tmp_path):
  copy = tmp_path / "run"
  shutil.copytree(runs / "run", copy)
  return copy


def _contents(path) -> dict:
  return {os.path.relpath(os.path.join(root, name), path):
          hashlib.sha256(open(os.path.join(root, name), "rb").read()).hexdigest()
          for root, _, files in os.walk(path) for name in files}


def _one_line(error) -> str:
  text = str(error.value)
  assert "\n" not in text, text
  return text


def _copy_step(source_dir, model_dir, as_step: int) -> str:
  destination = os.path.join(model_dir, "checkpoints", str(as_step))
  shutil.copytree(os.path.join(source_dir, "checkpoints", "2"), destination)
  return destination


def _metas(model_dir):
  checkpoints = os.path.join(model_dir, "checkpoints")
  return [os.path.join(checkpoints, step, "meta", "metadata") for step in os.listdir(checkpoints)]


@pytest.mark.slow
def test_each_step_carries_the_identity_of_its_run(model_dir):
  """Catches: a step whose meta says nothing of its run but its (mutable) config."""
  (path,) = _metas(model_dir)
  with open(path) as f:
    identity = json.load(f)["identity"]
  assert identity["fixed"]["runtime.seed"] == 0 and identity["fixed"]["model.mlp_units"] == 8
  assert "train.steps" not in identity["fixed"]
  assert identity["task"] == "trainer.supervised.task:SupervisedTask"
  assert identity["structure"]["variables"] > 0


@pytest.mark.slow
def test_an_edited_config_json_is_refused_and_nothing_is_written(model_dir):
  """(a) Catches: a resume trusting config.json over the checkpoint: runtime.seed edited
  there trained on other data (exit 0)."""
  path = model_dir / "config.json"
  edited = json.loads(path.read_text())
  edited["runtime"]["seed"] = 5
  edited["train"]["steps"] = 4
  path.write_text(json.dumps(edited))
  before = _contents(model_dir)
  with pytest.raises(UserError) as error:
    _train(model_dir, recorded.get_config(str(path)))  # what a resume without --config runs
  line = _one_line(error)
  assert "runtime.seed=5, but" in line and "runtime.seed=0" in line, line
  assert "checkpoints/2/meta/metadata" in line and "config.json says runtime.seed=5" in line
  assert _contents(model_dir) == before


@pytest.mark.slow
def test_an_emptied_config_json_and_another_seed_on_the_command_line_is_refused(model_dir):
  """(b) Catches: config.json replaced by {} (nothing recorded: nothing checked) and
  --config.runtime.seed=5 resuming on other data, exit 0."""
  (model_dir / "config.json").write_text("{}")
  before = _contents(model_dir)
  result = run_trainer(model_dir, *_FLAGS, "--config.train.steps=4", "--config.runtime.seed=5",
                       timeout=300)
  assert result.returncode == 2, result.stderr[-3000:]
  (line,) = result.error_lines()
  assert "runtime.seed=5, but" in line and "was trained with runtime.seed=0" in line, line
  assert _contents(model_dir) == before


@pytest.mark.slow
@pytest.mark.parametrize("other, field, theirs, ours", [
    ("seed1", "runtime.seed", "1", "0"),
    ("dropout", "model.dropout_rate", "0.5", "0.2"),
])
@pytest.mark.parametrize("mode", ["train", "eval", "export"])
def test_a_step_of_another_run_is_refused_and_left_in_place(runs, model_dir, other, field, theirs,
                                                           ours, mode):
  """(c) Catches: a step of another run (other seed, other dropout: the same shapes) copied
  into checkpoints/ and restored without a word."""
  step_dir = _copy_step(runs / other, model_dir, as_step=3)
  before = _contents(model_dir)
  with pytest.raises(UserError) as error:
    _train(model_dir, _config(**{"train.steps": 4}), mode=mode)
  line = _one_line(error)
  assert f"{field}={theirs}" in line and f"{field}={ours}" in line, line
  assert os.path.join("checkpoints", "3") in line, line
  assert os.path.isdir(step_dir) and not (model_dir / "checkpoints_corrupt").exists()
  assert _contents(model_dir) == before


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["train", "eval"])
def test_a_step_of_another_task_with_the_same_shapes_is_refused(tmp_path, mode):
  """(c) Catches: another Task's step (same variables, another objective) restored."""
  _train(tmp_path / "a", task=TaskA)
  _train(tmp_path / "b", task=TaskB)
  step_dir = _copy_step(tmp_path / "b", tmp_path / "a", as_step=3)
  with pytest.raises(UserError) as error:
    _train(tmp_path / "a", _config(**{"train.steps": 4}), mode=mode, task=TaskA)
  line = _one_line(error)
  assert "TaskB" in line and "TaskA" in line and "a step of another run" in line, line
  assert os.path.isdir(step_dir) and not (tmp_path / "a" / "checkpoints_corrupt").exists()


def _strip_identity(path):
  with open(path) as f:
    meta = json.load(f)
  del meta["identity"]
  with open(path, "w") as f:
    json.dump(meta, f)


@pytest.mark.slow
def test_a_step_written_before_the_identity_resumes(model_dir):
  """(d) Backward compatible: a meta with a config and no identity (distloop before
  issue 31) resumes."""
  for path in _metas(model_dir):
    _strip_identity(path)
  assert _train(model_dir, _config(**{"train.steps": 3}))["step"] == 3


@pytest.mark.slow
def test_an_old_step_of_another_run_is_judged_by_its_config(runs, model_dir):
  """(d) Catches: an old-format step (no identity) of another run restored by eval: its
  meta's config is its identity."""
  _strip_identity(os.path.join(_copy_step(runs / "seed1", model_dir, as_step=3), "meta",
                               "metadata"))
  with pytest.raises(UserError) as error:
    _train(model_dir, _config(), mode="eval")
  line = _one_line(error)
  assert "runtime.seed=1" in line and "runtime.seed=0" in line, line


@pytest.fixture(name="unreachable_mlflow")
def fixture_unreachable_mlflow(monkeypatch):
  """An MLflow client whose server never answers (the real client need not be installed)."""
  class MlflowClient:
    def __init__(self, tracking_uri):
      self.tracking_uri = tracking_uri

    def __getattr__(self, name):
      def call(*args, **kwargs):
        raise ConnectionError(f"cannot reach {self.tracking_uri}")
      return call

  package = types.ModuleType("mlflow")
  package.__spec__ = importlib.machinery.ModuleSpec("mlflow", None)
  package.MlflowClient = MlflowClient
  entities = types.ModuleType("mlflow.entities")
  entities.Param = entities.Metric = lambda *args: args
  package.entities = entities
  monkeypatch.setitem(sys.modules, "mlflow", package)
  monkeypatch.setitem(sys.modules, "mlflow.entities", entities)


@pytest.mark.slow
@pytest.mark.parametrize("unreadable_step", [False, True])
def test_a_resume_refused_by_mlflow_writes_nothing(model_dir, unreachable_mlflow,
                                                   unreadable_step):
  """(e) Catches: an unreachable runtime.mlflow_uri refused (exit 2) after config.json was
  rewritten and config_history/ added to, so the next plain resume inherited the URI; and
  (with an unreadable newer step) after that step was set aside in checkpoints_corrupt/."""
  if unreadable_step:
    for path in glob.glob(f"{_copy_step(model_dir, model_dir, as_step=3)}/*/manifest.ocdbt"):
      os.remove(path)
  before = _contents(model_dir)
  with pytest.raises(UserError, match="cannot log to MLflow"):
    _train(model_dir, _config(**{"train.steps": 4, "runtime.mlflow_uri": "http://127.0.0.1:9"}))
  assert _contents(model_dir) == before


def test_a_step_is_compared_field_by_field():
  """The comparison itself: fixed fields, the Task, the structure; data.dir may move."""
  config = _config().to_dict()
  shapes = {"model/tiny/dense/kernel": (784, 10)}
  meta = {"config": config, "identity": config_changes.identity(
      config, "tests.state.test_run_identity:TaskA", shapes)}
  config_changes.check_step(meta, "s", config, "__main__:TaskA", shapes, training=True)
  moved = _config(**{"data.dir": "/elsewhere"}).to_dict()
  config_changes.check_step(meta, "s", moved, "tests.state.test_run_identity:TaskA", shapes,
                            training=True)
  for other, task, other_shapes, words in [
      (_config(**{"train.loss": "mean_squared_error"}).to_dict(), "tests.state.test_run_identity:TaskA",
       shapes, "train.loss='sparse_categorical_crossentropy'"),
      (config, "tests.state.test_run_identity:TaskB", shapes, "the Task tests.state.test_run_identity:TaskA"),
      (config, "tests.state.test_run_identity:TaskA", {"model/tiny/dense/kernel": (784, 11)},
       "1 saved variables"),
  ]:
    with pytest.raises(UserError, match="a step of another run") as error:
      config_changes.check_step(meta, "s", other, task, other_shapes, training=True)
    assert words in str(error.value), str(error.value)
  del meta["identity"]  # an old step: its config decides
  with pytest.raises(UserError, match="runtime.seed=0"):
    config_changes.check_step(meta, "s", _config(**{"runtime.seed": 3}).to_dict(), "x:Y", shapes,
                              training=False)
