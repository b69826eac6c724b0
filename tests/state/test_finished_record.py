"""A finished.json that cannot be parsed, or whose step has no checkpoint on disk (an
edit, a corruption), is refused in one line (exit 2, nothing written) by every reader:
continuous_eval (and the evaluator task) and a rerun of training. It used to be ignored
silently: the sidecar of an early-stopped job then waited out eval.timeout_seconds (an
hour) for train.steps, and a rerun trained on past the early stop."""
import json
import os
import re
import shutil

import pytest

from tests.support.cli import REPO, run_trainer
from trainer.errors import UserError
from trainer.store import model_dir as layout

_FLAGS = ["--config=synthetic", "--config.model.conv_filters=4", "--config.model.dense_units=8",
          "--config.train.steps=60", "--config.train.global_batch_size=16",
          "--config.train.steps_per_loop=10", "--config.data.num_train_examples=320",
          "--config.data.num_eval_examples=64",
          f"--config.train.actions={os.path.join(REPO, 'tests', 'plugins', 'action_plugins.py')}:stop_at_40"]
_BROKEN = {  # name: (the bytes of finished.json, what the line says of them)
    "garbage": (b"\xff\x00\x13 not json",
                r"is not JSON \('utf-8' codec can't decode byte 0xff in position 0: invalid "
                r"start byte\)"),
    "step_999": (b'{"reason": "train.steps", "step": 999, "train_steps": 60}\n',
                 r"says training ended at step 999, but \S+/checkpoints/999 is not on disk "
                 r"\(the checkpoints there are of step\(s\) 40\)"),
}


@pytest.fixture(scope="module")
def early_stopped(tmp_path_factory):
  """A tiny run to 60 steps that an Action stopped at 40: finished.json says 40."""
  model_dir = tmp_path_factory.mktemp("early_stopped")
  result = run_trainer(model_dir, *_FLAGS, "--mode=train", timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  assert json.loads((model_dir / "finished.json").read_text())["step"] == 40
  return model_dir


def _with_finished_json(early_stopped, tmp_path, content: bytes):
  model_dir = tmp_path / "run"
  shutil.copytree(early_stopped, model_dir)
  (model_dir / "finished.json").write_bytes(content)
  return model_dir


def _files(model_dir) -> dict:
  """Every file under model_dir with its size and modification time."""
  found = {}
  for root, _, names in os.walk(model_dir):
    for name in names:
      stat = os.stat(os.path.join(root, name))
      found[os.path.relpath(os.path.join(root, name), model_dir)] = (stat.st_size,
                                                                    stat.st_mtime_ns)
  return found


def _refusal(result, model_dir, problem: str) -> None:
  assert result.returncode == 2, result.stderr[-3000:]
  assert "Traceback" not in result.stderr, result.stderr[-3000:]
  errors = [line for line in result.stderr.splitlines() if line.startswith("distloop: error:")]
  assert len(errors) == 1, result.stderr[-3000:]
  assert re.match(rf"distloop: error: {re.escape(str(model_dir))}/finished.json {problem}; it "
                  r"records where training ended, so it is not guessed: put back the one the "
                  r"finished run wrote, or remove it", errors[0]), errors[0]


@pytest.mark.parametrize("broken", sorted(_BROKEN))
@pytest.mark.parametrize("mode, before_the_fix", [
    ("continuous_eval", "no word of it, then eval.timeout_seconds (3,600 s) of waiting for "
                        "step 60"),
    ("train", "the rerun trained on from step 40 to 60, past the early stop, without a word")])
def test_a_broken_finished_json_is_refused_at_once(early_stopped, tmp_path, broken, mode,
                                                   before_the_fix):
  """continuous_eval and a rerun of training refuse it in one line, nothing written."""
  del before_the_fix  # what each mode did before (the test's id says which mode)
  content, problem = _BROKEN[broken]
  model_dir = _with_finished_json(early_stopped, tmp_path, content)
  before = _files(model_dir)
  result = run_trainer(model_dir, *_FLAGS, f"--mode={mode}", timeout=120)
  _refusal(result, model_dir, problem)
  assert _files(model_dir) == before


def test_the_record_a_run_wrote_is_read(tmp_path):
  (tmp_path / "checkpoints" / "40").mkdir(parents=True)
  layout.write_finished(str(tmp_path), 40, 60, stopped_by="stop_at_40")
  assert layout.finished_record(str(tmp_path)) == {"step": 40, "train_steps": 60,
                                                  "reason": "stopped by stop_at_40"}
  assert layout.final_step(str(tmp_path), 60) == 40
  os.remove(layout.finished_path(str(tmp_path)))
  assert layout.finished_record(str(tmp_path)) is None  # not finished: nothing to refuse


@pytest.mark.parametrize("content, problem", [
    (b"", r"is not JSON \(Expecting value"),
    (b'[40, 60]', r"holds no integer \"step\" and \"train_steps\" \('\[40, 60\]'\)"),
    (b'{"step": "40", "train_steps": 60}', r"holds no integer \"step\""),
    (b'{"step": true, "train_steps": 60}', r"holds no integer \"step\""),
    (b'{"step": 40, "train_steps": "60"}', r"holds no integer \"step\" and \"train_steps\""),
    (b'{"step": 20, "train_steps": 60}', r"says training ended at step 20, but .*/checkpoints/20 "
                                         r"is not on disk \(the checkpoints there are of "
                                         r"step\(s\) 40\)"),
])
def test_a_broken_record_is_refused_naming_what_is_wrong(tmp_path, content, problem):
  (tmp_path / "checkpoints" / "40").mkdir(parents=True)
  (tmp_path / "finished.json").write_bytes(content)
  with pytest.raises(UserError, match=rf"{re.escape(str(tmp_path))}/finished.json {problem}"):
    layout.finished_record(str(tmp_path))
