"""A Task says which fields of its own config section fix the run (issue 33, point 6):
`run_fixing_fields = {"own": ("width",)}` lets own.learning_rate (its own optimizer's
rate) change on resume, and used, while a change of own.width is refused in one line,
exit 2, nothing written. A Task that declares nothing keeps its section frozen whole."""
import csv
import os

import pytest

import trainer
from tests.plugins import run_fields_plugins
from tests.support.cli import REPO, run_trainer
from trainer.errors import UserError

_CONFIG = os.path.join(REPO, "tests", "plugins", "run_fields_plugins.py")


def _config(steps: int, task: str = "OwnLearningRate", **own):
  config = run_fields_plugins.get_config()
  config.train.steps = steps
  config.train.task = f"{_CONFIG}:{task}"
  for name, value in own.items():
    setattr(config.own, name, value)
  return config


def _learning_rates(model_dir) -> dict:
  with open(os.path.join(model_dir, "metrics.csv")) as f:
    return {int(row["step"]): float(row["value"]) for row in csv.DictReader(f)
            if row["name"] == "learning_rate"}


def test_a_field_the_task_frees_changes_on_resume_and_is_used(tmp_path, caplog):
  trainer.run(_config(2), str(tmp_path))
  caplog.clear()
  assert trainer.run(_config(4, learning_rate=0.02), str(tmp_path))["step"] == 4
  assert any("own.learning_rate=0.02 on resume (it was 0.1" in record.getMessage()
             for record in caplog.records), "the change is logged"
  rates = _learning_rates(tmp_path)
  assert rates[2] == pytest.approx(0.1) and rates[4] == pytest.approx(0.02), rates


def test_a_task_that_declares_nothing_keeps_its_section_frozen(tmp_path):
  trainer.run(_config(2, "DeclaresNothing"), str(tmp_path))
  with pytest.raises(UserError, match=r"own\.learning_rate=0\.02, but .* was trained with "
                                      r"own\.learning_rate=0\.1"):
    trainer.run(_config(4, "DeclaresNothing", learning_rate=0.02), str(tmp_path))


@pytest.mark.slow  # a CLI run (exit 2 is the command's): ~17 s
def test_a_field_that_fixes_the_run_is_refused_in_one_line_exit_2(tmp_path):
  trainer.run(_config(2), str(tmp_path))
  before = sorted(os.listdir(tmp_path))
  result = run_trainer(tmp_path, f"--config={_CONFIG}", "--config.train.steps=4",
                       "--config.own.width=8")
  assert result.returncode == 2, result.stderr
  assert len(result.error_lines()) == 1, result.stderr
  assert "own.width=8, but" in result.stderr and "own.width=4" in result.stderr
  assert sorted(os.listdir(tmp_path)) == before


@pytest.mark.parametrize("declaration, fragment", [
    ({"train": ("steps",)}, "distloop's own section"),
    ({"own": ("widht",)}, "own.widht, which this config does not have"),
    ({"other": ()}, "section 'other', which this config does not have"),
])
def test_a_wrong_declaration_is_refused_in_one_line(tmp_path, declaration, fragment):
  cls = type("Declared", (run_fields_plugins.OwnLearningRate,),
             {"run_fixing_fields": declaration})
  with pytest.raises(UserError, match=fragment):
    trainer.run(_config(2), str(tmp_path), task=cls())
  assert not os.listdir(tmp_path)
