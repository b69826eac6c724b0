"""A Task with a train_step only (README.md's my_task.py; tests/plugins/train_only_task.py): it
trains, and the run claims nothing it did not do; a mode with nothing to do for it is
refused in one line, exit 2, nothing written (issue 43). And the run summary's `config`
line is the command that ran, overrides included, ready to paste."""
import os
import shlex

import pytest

from tests.support.cli import run_trainer

_TASK = "tests/plugins/train_only_task.py:TrainsOnly"
_FLAGS = ["--config=synthetic", "--config.model.conv_filters=8",
          "--config.model.dense_units=16", "--config.train.steps=4",
          f"--config.train.task={_TASK}"]
_NO_EVAL = "TrainsOnly has no eval_step: --mode={mode} has nothing to evaluate"
_REFUSALS = {
    "eval": _NO_EVAL.format(mode="eval"),
    "continuous_eval": _NO_EVAL.format(mode="continuous_eval"),
    "export": ("TrainsOnly has no export(): --mode=export has nothing to write (export() "
               "returns a trainer.Export, docs/tasks.md)"),
    "train_and_eval": _NO_EVAL.format(mode="train_and_eval")
                      + "; --mode=train trains without evals",
}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  """(model_dir, the run's final block): 4 steps of TrainsOnly."""
  model_dir = tmp_path_factory.mktemp("train_only") / "run"
  result = run_trainer(model_dir, *_FLAGS, timeout=300)
  assert result.returncode == 0, f"exit {result.returncode}\n{result.stderr[-3000:]}"
  return model_dir, result.stderr[result.stderr.index("Done at step 4"):]


def _files(model_dir) -> dict:
  """Every file under model_dir with its size and modification time."""
  return {os.path.join(root, name): (os.stat(os.path.join(root, name)).st_size,
                                     os.stat(os.path.join(root, name)).st_mtime_ns)
          for root, _, names in os.walk(model_dir) for name in names}


def test_the_summary_of_a_task_without_eval_or_export_claims_neither(trained):
  """Caught: the final block said `eval | 0 examples` and listed an export/ that was
  never written."""
  model_dir, block = trained
  lines = block.splitlines()
  assert not any(line.lstrip().startswith("eval") for line in lines), block
  time_line = next(line for line in lines if line.lstrip().startswith("time"))
  assert "eval" not in time_line, time_line
  outputs = next(line for line in lines if line.lstrip().startswith("outputs"))
  assert outputs.endswith(f"{model_dir} (summary.json, checkpoints/, tensorboard/)"), outputs
  assert not (model_dir / "export").exists()


def test_the_summary_config_line_is_the_command_with_every_override(trained):
  """Caught: the `config` line said `--config=synthetic` only: the run's overrides (here
  its Task and step count) were not there to reproduce it."""
  model_dir, block = trained
  line = next(line for line in block.splitlines() if line.lstrip().startswith("config "))
  command = shlex.split(line.split("config", 1)[1])
  assert command == ["python", "-m", "trainer", "--config=synthetic",
                     f"--model_dir={model_dir}", *_FLAGS[1:]], line


@pytest.mark.parametrize("mode", ["eval", "export", "continuous_eval"])
def test_a_mode_with_nothing_to_do_for_the_task_is_refused(trained, mode):
  """Caught: --mode=eval printed {"step": 4, "examples": 0} and --mode=export printed
  "None", both exit 0 (continuous_eval evaluated nothing at every checkpoint)."""
  model_dir, _ = trained
  before = _files(model_dir)
  result = run_trainer(model_dir, f"--mode={mode}", timeout=300)
  assert result.returncode == 2, f"exit {result.returncode}\n{result.stderr[-3000:]}"
  assert result.error_lines() == [f"distloop: error: {_REFUSALS[mode]}"]
  assert not result.stdout
  assert _files(model_dir) == before


def test_train_and_eval_of_a_task_without_eval_step_is_refused(tmp_path):
  """Caught: --mode=train_and_eval trained, evaluated nothing at each interval and
  reported `eval | 0 examples`."""
  result = run_trainer(tmp_path / "run", *_FLAGS, "--mode=train_and_eval", timeout=300)
  assert result.returncode == 2, f"exit {result.returncode}\n{result.stderr[-3000:]}"
  assert result.error_lines() == [f"distloop: error: {_REFUSALS['train_and_eval']}"]
  assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("mode", ["eval", "export"])
def test_the_python_api_raises_the_same_line(tmp_path, mode):
  """trainer.run gives the CLI's refusal as a UserError (it returned {"examples": 0} and
  None), in the API's words (mode='eval', not --mode=eval)."""
  import configs  # pylint: disable=g-import-not-at-top
  import trainer  # pylint: disable=g-import-not-at-top
  from tests.plugins import train_only_task  # pylint: disable=g-import-not-at-top
  from trainer.errors import UserError  # pylint: disable=g-import-not-at-top
  config = configs.get("synthetic")
  config.train.steps = 4
  with pytest.raises(UserError) as refused:
    trainer.run(config, str(tmp_path / "run"), mode=mode, task=train_only_task.TrainsOnly)
  assert str(refused.value) == _REFUSALS[mode].replace(f"--mode={mode}", f"mode='{mode}'")
  assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("typed, resolved_config, shown", [
    ([], "synthetic", "--config=synthetic"),  # none typed, none recorded: the default
    ([], "recorded:/runs/a/config.json", "--config=/runs/a/config.json"),  # a resume
    (["--config", "examples/gan.py"], "examples/gan.py", "--config=examples/gan.py"),
])
def test_the_command_names_the_config_the_run_used(typed, resolved_config, shown):
  """The config line's command when --config was not typed (a model_dir's config.json,
  or synthetic) or typed as two words; values with spaces stay one word."""
  import configs  # pylint: disable=g-import-not-at-top
  from configs.files import RECORDED  # pylint: disable=g-import-not-at-top
  from trainer.cli import config_file  # pylint: disable=g-import-not-at-top
  spec = (configs.path_of(resolved_config) if resolved_config in configs.NAMES
          else resolved_config.replace("recorded", RECORDED))
  argv = ["trainer", *typed, "--model_dir=/runs/a", "--config.data.dir=/my data"]
  resolved = [argv[0], f"--config={spec}", *argv[1:]]
  assert shlex.split(config_file.command(argv, resolved)) == [
      "python", "-m", "trainer", shown, "--model_dir=/runs/a", "--config.data.dir=/my data"]
