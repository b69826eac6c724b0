"""A newcomer follows the README top to bottom: each file it shows (a code block whose first
line is `# NAME.py`) is written as shown, and each `python -m trainer` command it shows
runs as written in that folder (model_dir under the test's tmp folder), and finishes.
The test command itself is not run (it is this suite)."""
import json
import os
import re
import subprocess

import pytest

from tests.support.cli import REPO, user_environment
from tests.support.doc_blocks import as_run_here, blocks
from tests.support.processes import loopback_only, needs_loopback

_README = os.path.join(REPO, "README.md")


def _walk():
  """The README's files (name -> text) and its trainer commands, in reading order."""
  files, commands = {}, []
  for language, body in blocks(open(_README, encoding="utf-8").read()):
    first = body.splitlines()[0] if body.strip() else ""
    if language == "python" and re.fullmatch(r"# [\w.]+\.py", first.strip()):
      files[first.strip()[2:]] = body
    elif language == "bash":
      for line in body.replace("\\\n", " ").splitlines():
        line = line.split("&&")[-1].strip()  # `pip install -e . && python -m trainer ...`
        if line.startswith("python -m trainer") and "pytest" not in line:
          commands.append(line)
  return files, commands


def test_the_readme_shows_files_and_trainer_commands():
  files, commands = _walk()
  assert {"my_model.py", "my_task.py"} <= set(files), files.keys()
  assert any("trainer.launch" in command for command in commands), commands
  assert len(commands) >= 5, commands  # quickstart, model, task, mirrored, launch


def commands() -> list[str]:
  """The README's trainer commands, as written (tests/docs/test_doc_commands.py skips these)."""
  return _walk()[1]


def _commands(launch: bool):
  return [command for command in commands() if ("trainer.launch" in command) == launch]


@pytest.mark.slow
@pytest.mark.parametrize("command", _commands(launch=False))
def test_each_readme_command_runs_as_written(tmp_path, command):
  files, _ = _walk()
  for name, text in files.items():
    (tmp_path / name).write_text(text)
  argv = as_run_here(command, tmp_path)
  env = {**user_environment(), "PYTHONPATH": REPO}  # as after `pip install -e .`
  completed = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True,
                             timeout=900)
  assert completed.returncode == 0, f"{command}\n{completed.stderr[-4000:]}"
  model_dir = next(word.split("=", 1)[1] for word in argv if word.startswith("--model_dir="))
  with open(os.path.join(model_dir, "summary.json"), encoding="utf-8") as f:
    summary = json.load(f)
  assert summary["step"] > 0, summary


@pytest.mark.slow
@needs_loopback
@pytest.mark.parametrize("command", _commands(launch=True))
def test_the_readme_launch_command_runs_as_written(tmp_path, command):
  argv = loopback_only() + as_run_here(command, tmp_path)
  env = {**user_environment(), "PYTHONPATH": REPO}
  completed = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True,
                             timeout=900)
  assert completed.returncode == 0, f"{command}\n{completed.stderr[-4000:]}"
  assert os.path.isfile(tmp_path / "mw" / "summary.json")
