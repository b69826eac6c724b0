"""A resume may change how the run goes on (train.steps, ...), not what it is (the
model, the data, the seed): those are refused in one line before anything is written,
and config_history/ keeps every config the model_dir was trained with."""
import hashlib
import json
import os
import shutil

import pytest

from tests.support.cli import run_trainer, train_ok
from trainer.state import config_changes
from trainer.store import model_dir as layout
from trainer.errors import UserError

_FLAGS = ["--config=synthetic", "--config.train.steps_per_loop=2",
          "--config.data.num_train_examples=256", "--config.data.num_eval_examples=64"]


@pytest.fixture(scope="module")
def trained_once(tmp_path_factory):
  model_dir = tmp_path_factory.mktemp("trained") / "run"
  train_ok(model_dir, *_FLAGS, "--config.train.steps=2", timeout=300)
  return model_dir


@pytest.fixture
def model_dir(trained_once, tmp_path):
  copy = tmp_path / "run"
  shutil.copytree(trained_once, copy)
  return copy


def _contents(path) -> dict:
  return {os.path.relpath(os.path.join(root, name), path):
          hashlib.sha256(open(os.path.join(root, name), "rb").read()).hexdigest()
          for root, _, files in os.walk(path) for name in files}


@pytest.mark.parametrize("flag, field, old, new", [
    ("--config.runtime.seed=1", "runtime.seed", "0", "1"),
    ("--config.data.num_train_examples=300", "data.num_train_examples", "256", "300"),
])
def test_changing_a_fixed_field_on_resume_is_refused(model_dir, flag, field, old, new):
  before = _contents(model_dir)
  result = run_trainer(model_dir, *_FLAGS, "--config.train.steps=4", flag, timeout=300)
  assert result.returncode == 2, result.stderr[-3000:]
  lines = result.error_lines()
  assert len(lines) == 1, result.stderr[-3000:]
  assert f"{field}={new}, but {model_dir} was trained with {field}={old}" in lines[0]
  assert "checkpoint.init_from" in lines[0]
  assert _contents(model_dir) == before


def test_a_finished_run_with_another_seed_is_not_already_finished(model_dir):
  result = run_trainer(model_dir, *_FLAGS, "--config.train.steps=2", "--config.runtime.seed=3",
                       timeout=300)
  assert result.returncode == 2 and "runtime.seed=3" in result.stderr, result.stderr[-3000:]
  assert "Already finished" not in result.stdout


def test_without_config_json_the_checkpoint_meta_is_the_record(model_dir):
  os.remove(model_dir / "config.json")
  result = run_trainer(model_dir, *_FLAGS, "--config.train.steps=4", "--config.runtime.seed=1",
                       timeout=300)
  assert result.returncode == 2, result.stderr[-3000:]
  assert f"({model_dir}/checkpoints/2/meta/metadata)" in result.stderr


def test_changing_train_steps_resumes_and_keeps_the_history(model_dir):
  summary = train_ok(model_dir, *_FLAGS, "--config.train.steps=4", timeout=300)
  assert summary["step"] == 4
  history = sorted(os.listdir(model_dir / "config_history"))
  assert len(history) == 2 and history[0].endswith("_step0.json"), history
  assert history[1].endswith("_step2.json"), history
  steps = [json.loads((model_dir / "config_history" / name).read_text())["train"]["steps"]
           for name in history]
  assert steps == [2, 4]
  assert json.loads((model_dir / "config.json").read_text())["train"]["steps"] == 4
  # Resumed with no --config at all: the recorded config (now 4 steps) is already done.
  again = run_trainer(model_dir, timeout=300)
  assert again.returncode == 0 and "Already finished at step 4" in again.stdout, again.stderr
  assert len(os.listdir(model_dir / "config_history")) == 2  # the same config: no new entry


def test_which_fields_a_resume_may_change():
  for field in ("model.dense_units", "model.name", "data.name", "data.num_train_examples",
                "data.preprocess", "runtime.seed", "runtime.mixed_precision", "train.loss",
                "train.from_logits", "train.optimizer", "augment.strength"):
    assert config_changes.is_fixed(field), field
  for field in ("train.steps", "train.learning_rate", "train.lr_schedule",
                "train.global_batch_size", "train.steps_per_loop", "eval.global_batch_size",
                "checkpoint.max_to_keep", "checkpoint.interval", "runtime.strategy",
                "runtime.num_cpu_devices"):
    assert not config_changes.is_fixed(field), field


def test_the_data_moved_to_another_path_resumes_with_a_warning(tmp_path, caplog):
  recorded = {"data": {"name": "mnist", "dir": "/old/mount"}, "runtime": {"seed": 0}}
  (tmp_path / "config.json").write_text(json.dumps(recorded))
  (tmp_path / "checkpoints" / "4").mkdir(parents=True)
  moved = {"data": {"name": "mnist", "dir": "/new/mount"}, "runtime": {"seed": 0}}
  config_changes.check(str(tmp_path), moved)  # no refusal
  assert any("/new/mount" in r.getMessage() and "/old/mount" in r.getMessage()
             for r in caplog.records)
  with pytest.raises(UserError, match="data.name"):
    config_changes.check(str(tmp_path), {**moved, "data": {"name": "fashion_mnist",
                                                            "dir": "/new/mount"}})


def test_a_config_json_from_before_the_history_is_kept(tmp_path):
  (tmp_path / "config.json").write_text(json.dumps({"train": {"steps": 2}}))
  layout.record_config(str(tmp_path), {"train": {"steps": 4}}, step=2)
  layout.record_config(str(tmp_path), {"train": {"steps": 4}}, step=3)  # the same: no entry
  history = sorted(os.listdir(tmp_path / "config_history"))
  assert [name.split("_", 1)[1] for name in history] == ["earlier.json", "step2.json"]
  assert json.loads((tmp_path / "config_history" / history[0]).read_text()) == {
      "train": {"steps": 2}}
  assert json.loads((tmp_path / "config.json").read_text()) == {"train": {"steps": 4}}


def test_resumed_at_the_final_step_reports_the_train_values_logged_there(model_dir):
  """A run whose final checkpoint is on disk but that did not finish (killed after the save)
  trains no step when started again: its summary and Done line give the values logged at
  that step, not NaN (and not a 0 examples/s that reads like a hung run)."""
  first = json.loads((model_dir / "summary.json").read_text())
  for name in ("summary.json", "finished.json"):
    os.remove(model_dir / name)
  result = run_trainer(model_dir, *_FLAGS, "--config.train.steps=2")
  assert result.returncode == 0, result.stderr[-3000:]
  again = json.loads((model_dir / "summary.json").read_text())
  assert (first["trained_steps"], again["trained_steps"]) == (2, 0)
  for name in ("train_loss", "train_accuracy"):
    assert again[name] == first[name]  # metrics.csv holds repr(float): the same float
  assert "loss nan" not in result.stderr
  assert "no step trained in this process (resumed at the final step)" in result.stderr
