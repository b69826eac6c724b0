"""A user's module named like one of distloop's top-level packages (trainer, models,
configs, input_pipelines) is one line naming both, exit 2, nothing written, in either
direction: shadowing distloop's package, or shadowed by it. A config file imports
its own modules from its folder, as a plug-in does."""
import os
import subprocess
import sys
import textwrap

import pytest

from tests.support.cli import REPO, Result, user_environment

_MODELS_PY = "def build(model_config, input_spec):\n  raise AssertionError('never called')\n"
_CONFIG_PY = textwrap.dedent("""\
    from configs import common
    {imports}
    def get_config():
      config = common.base_config()
      config.train.steps = 2
      {body}
      return config
    """)


def _run(cwd, *command: str) -> Result:
  """`python COMMAND` run from `cwd`, with the worktree's distloop importable."""
  completed = subprocess.run(
      [sys.executable, *command], cwd=cwd, capture_output=True, text=True, timeout=120,
      env={**user_environment(), "PYTHONPATH": REPO})
  return Result(completed.returncode, completed.stdout, completed.stderr)


def _one_line(result: Result) -> str:
  assert result.returncode == 2, result.stderr[-3000:]
  lines = result.error_lines()
  assert len(lines) == 1, result.stderr[-3000:]
  assert lines[0].startswith("distloop: error: ")
  return lines[0]


def test_a_models_py_in_the_working_directory_is_named_with_distloops_package(tmp_path):
  (tmp_path / "models.py").write_text(_MODELS_PY)
  (tmp_path / "my_config.py").write_text(
      _CONFIG_PY.format(imports="", body="config.model.name = 'models:build'"))
  line = _one_line(_run(tmp_path, "-m", "trainer", "--config=my_config.py",
                        f"--model_dir={tmp_path / 'run'}"))
  assert f"{tmp_path / 'models.py'} shadows distloop's package models" in line
  assert os.path.join(REPO, "models") in line and "rename" in line
  assert not (tmp_path / "run").exists()


def test_a_models_py_beside_the_config_file_is_named_with_distloops_package(tmp_path):
  """The config runs elsewhere than its folder: its `from models import build` would get
  distloop's models (imported already), not the file beside it."""
  project = tmp_path / "project"
  project.mkdir()
  (project / "models.py").write_text(_MODELS_PY)
  (project / "my_config.py").write_text(
      _CONFIG_PY.format(imports="from models import build", body=""))
  line = _one_line(_run(tmp_path, "-m", "trainer", "--config=project/my_config.py",
                        f"--model_dir={tmp_path / 'run'}"))
  assert f"{project / 'models.py'}, beside --config=project/my_config.py" in line
  assert os.path.join(REPO, "models") in line and "rename" in line
  assert not (tmp_path / "run").exists()


def test_a_script_beside_a_models_py_gets_the_line_from_the_python_api(tmp_path):
  (tmp_path / "models.py").write_text(_MODELS_PY)
  (tmp_path / "train.py").write_text(
      "import trainer\ntry:\n  trainer.run\nexcept ImportError as e:\n  print('LINE', e)\n")
  result = _run(tmp_path, "train.py")
  assert result.returncode == 0, result.stderr[-3000:]
  assert f"LINE {tmp_path / 'models.py'} shadows distloop's package models" in result.stdout


def test_a_plugin_importing_its_own_models_py_is_one_line(tmp_path):
  from trainer.errors import UserError  # pylint: disable=g-import-not-at-top
  from trainer.setup import plugins  # pylint: disable=g-import-not-at-top
  (tmp_path / "models.py").write_text(_MODELS_PY)
  (tmp_path / "my_plugins.py").write_text("import models\nbuild = models.build\n")
  with pytest.raises(UserError) as raised:
    plugins.resolve("model.name", f"{tmp_path / 'my_plugins.py'}:build")
  assert str(raised.value).startswith(
      f"{tmp_path / 'models.py'}, beside model.name='{tmp_path / 'my_plugins.py'}:build', "
      f"has the name of distloop's package models")
  assert "\n" not in str(raised.value)


def test_a_plugin_file_named_models_py_still_loads_under_a_name_of_its_own(tmp_path):
  from trainer.setup import plugins  # pylint: disable=g-import-not-at-top
  (tmp_path / "models.py").write_text(_MODELS_PY)
  build = plugins.resolve("model.name", f"{tmp_path / 'models.py'}:build")
  assert build.__module__ == "_distloop_plugin_models"


def _project_with_a_helper(tmp_path):
  project = tmp_path / "project"
  project.mkdir()
  (project / "project_sizes.py").write_text("STEPS = 3\nEXAMPLES = 64\n")
  (project / "my_config.py").write_text(_CONFIG_PY.format(
      imports="import project_sizes",
      body="config.train.steps = project_sizes.STEPS\n"
           "  config.data.num_train_examples = project_sizes.EXAMPLES\n"
           "  config.data.num_eval_examples = project_sizes.EXAMPLES"))
  return project / "my_config.py"


def test_a_config_file_imports_its_own_module_from_its_folder(tmp_path, monkeypatch):
  """As --config loads it (the working directory elsewhere)."""
  from trainer.cli import config_file  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(sys, "path", list(sys.path))  # the folder the config adds goes again
  config = config_file.Parser().parse(str(_project_with_a_helper(tmp_path)))
  assert config.train.steps == 3 and config.data.num_train_examples == 64


@pytest.mark.slow  # trains (3 steps): ~15-50 s on the shared machine
def test_trainer_run_with_a_config_file_importing_its_own_module(tmp_path, monkeypatch):
  import trainer  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(sys, "path", list(sys.path))
  summary = trainer.run(str(_project_with_a_helper(tmp_path)), str(tmp_path / "run"))
  assert summary["step"] == 3 and summary["eval_examples"] == 64
