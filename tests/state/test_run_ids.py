"""Each run has an id (issue 43): model_dir/run_id.json, and every checkpoint step's meta.
Two runs whose fixed fields are the same (only train.learning_rate differs, which a resume
may change) have the same identity by fields, so before run ids a step of one copied into
the other's checkpoints/ was restored without a word. Now a resume, eval or export refuses
a step of another run in one line (exit 2, nothing written or moved); checkpoint.init_from
still starts a new run (an id of its own) from such a step; a model_dir or step written
before run ids is taken as this model_dir's run."""
import hashlib
import json
import os
import shutil

import pytest

from tests.support.cli import run_trainer, train_ok
from trainer.errors import UserError
from trainer.state import config_changes

_FLAGS = ["--config=synthetic", "--config.model.conv_filters=8",
          "--config.model.dense_units=16", "--config.checkpoint.interval=5"]
_TO_10 = [*_FLAGS, "--config.train.steps=10"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  """Run A trained to step 5; run B, the same but for its learning rate, to step 10."""
  root = tmp_path_factory.mktemp("runs")
  train_ok(root / "a", *_FLAGS, "--config.train.steps=5")
  train_ok(root / "b", *_TO_10, "--config.train.learning_rate=0.05")
  return root


@pytest.fixture
def a_with_b_step(runs, tmp_path):
  """A copy of run A whose checkpoints/ holds B's step 10 too (as if copied in by hand)."""
  model_dir = tmp_path / "a"
  shutil.copytree(runs / "a", model_dir)
  shutil.copytree(runs / "b" / "checkpoints" / "10", model_dir / "checkpoints" / "10")
  return model_dir


def _contents(path) -> dict:
  return {os.path.relpath(os.path.join(root, name), path):
          hashlib.sha256(open(os.path.join(root, name), "rb").read()).hexdigest()
          for root, _, files in os.walk(path) for name in files}


def _run_id(model_dir) -> str:
  return json.loads((model_dir / "run_id.json").read_text())["run_id"]


def _step_run(model_dir, step: int):
  meta = json.loads((model_dir / "checkpoints" / str(step) / "meta" / "metadata").read_text())
  return meta["identity"].get("run_id")


def _refused(model_dir, *flags) -> str:
  """The one line of a refused run (exit 2) that restored nothing and changed no file."""
  before = _contents(model_dir)
  result = run_trainer(model_dir, *flags, timeout=300)
  assert result.returncode == 2, f"exit {result.returncode}\n{result.stderr[-3000:]}"
  (line,) = result.error_lines()
  assert "Restored checkpoint" not in result.stderr
  assert _contents(model_dir) == before
  return line


def test_each_run_has_an_id_in_its_model_dir_and_its_steps(runs):
  """Catches: runs told apart by their fields only (no id, or one id for both runs)."""
  a, b = _run_id(runs / "a"), _run_id(runs / "b")
  assert a != b and len(a) == 32
  assert _step_run(runs / "a", 5) == a
  assert _step_run(runs / "b", 5) == _step_run(runs / "b", 10) == b


@pytest.mark.parametrize("mode", ["train", "eval"])
def test_a_step_of_another_run_with_the_same_fixed_fields_is_refused(runs, a_with_b_step, mode):
  """Catches: B's step 10 (only the learning rate differs) restored by A's resume or eval,
  exit 0, as if A had trained it."""
  line = _refused(a_with_b_step, *_TO_10, f"--mode={mode}")
  step_dir = str(a_with_b_step / "checkpoints" / "10")
  assert f"{step_dir} belongs to another run" in line, line
  assert _run_id(runs / "b") in line and _run_id(a_with_b_step) in line, line
  assert f"--config.checkpoint.init_from={step_dir}" in line, line


@pytest.mark.parametrize("deleted", ["config.json", "run_id.json"])
def test_a_step_of_another_run_is_refused_without_config_json_or_run_id_json(a_with_b_step,
                                                                             deleted):
  """Catches: the model_dir's run read from a file that may be lost. Without config.json
  run_id.json says which run the model_dir is; without run_id.json the steps name two
  runs, and nothing says which is this one's: refused, naming both."""
  (a_with_b_step / deleted).unlink()
  line = _refused(a_with_b_step, *_TO_10)
  if deleted == "config.json":
    assert "checkpoints/10 belongs to another run" in line, line
  else:
    assert "holds steps of more than one run" in line and "run_id.json" in line, line
    assert "step 5: " in line and "step 10: " in line, line


def test_a_model_dir_without_run_id_json_resumes_as_the_run_its_steps_name(runs, tmp_path):
  """Catches: a model_dir whose run_id.json was lost taken for a new run (its steps then
  refused as another's) or given a new id (its next steps naming another run)."""
  model_dir = tmp_path / "a"
  shutil.copytree(runs / "a", model_dir)
  (model_dir / "run_id.json").unlink()
  assert train_ok(model_dir, *_TO_10)["step"] == 10
  assert _run_id(model_dir) == _run_id(runs / "a") == _step_run(model_dir, 10)


def test_init_from_a_step_of_another_run_starts_a_run_of_its_own(runs, a_with_b_step, tmp_path):
  """Catches: checkpoint.init_from refused for the run id of its source, or the new run
  taking on that id (its steps would then pass for the source run's)."""
  model_dir = tmp_path / "c"
  train_ok(model_dir, *_FLAGS, "--config.train.steps=5",
           f"--config.checkpoint.init_from={a_with_b_step / 'checkpoints' / '10'}")
  run = _run_id(model_dir)
  assert run not in (_run_id(runs / "a"), _run_id(runs / "b"))
  assert _step_run(model_dir, 5) == run


def test_a_model_dir_written_before_run_ids_resumes(runs, tmp_path):
  """Backward compatible: no run_id.json and steps naming no run (distloop before run ids)
  resume; the run gets an id, which the new steps name."""
  model_dir = tmp_path / "a"
  shutil.copytree(runs / "a", model_dir)
  (model_dir / "run_id.json").unlink()
  path = model_dir / "checkpoints" / "5" / "meta" / "metadata"
  meta = json.loads(path.read_text())
  del meta["identity"]["run_id"]
  path.write_text(json.dumps(meta))
  assert train_ok(model_dir, *_TO_10)["step"] == 10
  assert _step_run(model_dir, 5) is None and _step_run(model_dir, 10) == _run_id(model_dir)


def test_run_ids_are_compared_step_by_step(tmp_path):
  """The comparison itself (pure Python): a step naming no run, or a model_dir naming
  none, is this run's; another id is refused; without run_id.json the steps decide."""
  ours, theirs = config_changes.new_run_id(), config_changes.new_run_id()
  def meta(run):
    return {"identity": config_changes.identity({}, "t:T", {}, run)}
  for step_run, dir_run in [(ours, ours), (None, ours), (ours, None), (None, None)]:
    config_changes.check_run(meta(step_run), "s", dir_run, "src")
  with pytest.raises(UserError, match=f"s belongs to another run \\(run {theirs}; this "
                                      f"model_dir's run is {ours}, src\\)"):
    config_changes.check_run(meta(theirs), "s", ours, "src")

  def save(step, run):
    path = tmp_path / "checkpoints" / str(step) / "meta" / "metadata"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(meta(run)))
  assert config_changes.model_dir_run(str(tmp_path)) == (None, "")
  save(1, None)
  assert config_changes.model_dir_run(str(tmp_path)) == (None, "")  # before run ids
  save(2, ours)
  with pytest.raises(UserError, match="step 1: no run id, step 2: "):
    config_changes.model_dir_run(str(tmp_path))
  shutil.rmtree(tmp_path / "checkpoints" / "1")
  assert config_changes.model_dir_run(str(tmp_path))[0] == ours
  (tmp_path / "run_id.json").write_text(json.dumps({"run_id": theirs}))
  assert config_changes.model_dir_run(str(tmp_path)) == (theirs, str(tmp_path / "run_id.json"))
