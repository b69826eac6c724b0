"""Every checkpoint unreadable: refused in one line with every byte left in place (exit 2
for corrupt content, exit 1 for a permission or I/O error, which is never "corrupt"),
unless checkpoint.if_unreadable=start_over asks to set them aside and train from step 0.
(One corrupt latest step falling back to the previous one: test_checkpoint_recovery.py.)"""
import glob
import hashlib
import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.support.cli import REPO, Result, run_trainer, train_ok, user_environment

_FLAGS = ["--config=synthetic", "--config.train.steps_per_loop=2",
          "--config.checkpoint.interval=2", "--config.data.num_train_examples=256",
          "--config.data.num_eval_examples=64"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  """A model_dir with checkpoints 2 and 4, copied by each test."""
  model_dir = tmp_path_factory.mktemp("trained")
  train_ok(model_dir, *_FLAGS, "--config.train.steps=4")
  assert sorted(os.listdir(model_dir / "checkpoints")) == ["2", "4"]
  return model_dir


def _copy(trained, tmp_path):
  model_dir = tmp_path / "model_dir"
  shutil.copytree(trained, model_dir)
  return model_dir


def _truncate_arrays(step_dir):
  for path in glob.glob(f"{step_dir}/*/**/d/*", recursive=True):
    with open(path, "r+b") as f:
      f.truncate(8)


def _delete_manifests(step_dir):
  for path in glob.glob(f"{step_dir}/*/manifest.ocdbt"):
    os.remove(path)


def _every_byte(model_dir) -> dict:
  """{relative path: sha256} of every file under model_dir/checkpoints."""
  root = model_dir / "checkpoints"
  hashes = {}
  for parent, _, names in os.walk(root):
    for name in names:
      path = os.path.join(parent, name)
      with open(path, "rb") as f:
        hashes[os.path.relpath(path, root)] = hashlib.sha256(f.read()).hexdigest()
  return hashes


def _one_line(result: Result, code: int) -> str:
  assert result.returncode == code, result.stderr[-3000:]
  assert "Traceback" not in result.stderr, result.stderr[-3000:]
  assert len(result.error_lines()) == 1, result.stderr[-3000:]
  return result.error_lines()[0]


@pytest.mark.parametrize("damage", [_truncate_arrays, _delete_manifests],
                         ids=["truncated", "deleted-files"])
def test_every_checkpoint_corrupt_is_refused_and_kept_byte_for_byte(trained, tmp_path, damage):
  model_dir = _copy(trained, tmp_path)
  for step in ("2", "4"):
    damage(model_dir / "checkpoints" / step)
  before = _every_byte(model_dir)
  result = run_trainer(model_dir, *_FLAGS, "--config.train.steps=6")
  line = _one_line(result, 2)
  assert line.startswith("distloop: error: no checkpoint in ") and "step(s) 4, 2" in line
  assert "checkpoint.if_unreadable=start_over" in line and "nothing was moved" in line
  assert _every_byte(model_dir) == before
  assert not (model_dir / "checkpoints_corrupt").exists()
  assert not (model_dir / ".lock").exists()
  assert json.loads((model_dir / "summary.json").read_text())["step"] == 4  # the old run's


def test_if_unreadable_start_over_sets_them_aside_and_trains_from_step_0(trained, tmp_path):
  model_dir = _copy(trained, tmp_path)
  for step in ("2", "4"):
    _truncate_arrays(model_dir / "checkpoints" / step)
  result = run_trainer(model_dir, *_FLAGS, "--config.train.steps=6",
                       "--config.checkpoint.if_unreadable=start_over")
  assert result.returncode == 0, result.stderr[-3000:]
  assert "Traceback" not in result.stderr
  for step in (4, 2):
    assert (f"Checkpoint {step} is unreadable" in result.stderr
            and "training starts over from step 0" in result.stderr), result.stderr[-3000:]
  kept = sorted(name.split(".")[0] for name in os.listdir(model_dir / "checkpoints_corrupt"))
  assert kept == ["2", "4"]
  assert "from step 0 to 6" in result.stderr
  assert json.loads((model_dir / "summary.json").read_text())["step"] == 6


def test_if_unreadable_is_checked(tmp_path):
  result = run_trainer(tmp_path, *_FLAGS, "--config.checkpoint.if_unreadable=retrain")
  assert "checkpoint.if_unreadable='retrain'" in _one_line(result, 2)
  assert not tmp_path.joinpath("checkpoints").exists()


_NO_SETPRIV = shutil.which("setpriv") is None or os.geteuid() != 0


@pytest.mark.skipif(_NO_SETPRIV, reason="needs root and setpriv(1): root reads through chmod "
                                        "unless setpriv drops dac_override and dac_read_search")
@pytest.mark.parametrize("unreadable", ["files", "directories"])
def test_every_checkpoint_denied_by_permissions_stops_and_moves_nothing(trained, tmp_path,
                                                                        unreadable):
  """A permission (or I/O) error is never corruption: exit 1 naming the step, the
  directory and the reason; nothing set aside, nothing retrained."""
  model_dir = _copy(trained, tmp_path)
  before = _every_byte(model_dir)
  denied = []
  for step in ("2", "4"):
    step_dir = model_dir / "checkpoints" / step
    if unreadable == "files":
      denied += [os.path.join(parent, name) for parent, _, names in os.walk(step_dir)
                 for name in names]
    else:
      denied.append(step_dir)
  for path in denied:
    os.chmod(path, 0)
  try:
    command = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--",
               sys.executable, "-m", "trainer", f"--model_dir={model_dir}", *_FLAGS,
               "--config.train.steps=6"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=REPO,
                          env=user_environment())
    result = Result(done.returncode, done.stdout, done.stderr)
  finally:
    for path in denied:
      os.chmod(path, 0o755 if os.path.isdir(path) else 0o644)
  line = _one_line(result, 1)
  assert line.startswith("distloop: error: cannot read checkpoint 4 in ")
  assert str(model_dir / "checkpoints") in line and "Permission denied" in line
  assert not (model_dir / "checkpoints_corrupt").exists()
  assert sorted(os.listdir(model_dir / "checkpoints")) == ["2", "4"]
  assert _every_byte(model_dir) == before
  assert json.loads((model_dir / "summary.json").read_text())["step"] == 4
