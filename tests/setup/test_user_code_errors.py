"""User code that fails is one line on stderr, never a traceback (issue 31, defect 10).

At run time (an assertion in a Task's compiled step, a value TensorFlow cannot sum, an
Action raising at a boundary or in a phase): exit 1, the line names the Task or Action
and the step, and says which checkpoint is intact. What can be checked before step 1
is refused there (exit 2, nothing written): a Task's export() with an input_spec its
model cannot take or a non-model (it used to fail after training, and again on every
rerun), a metrics.csv that is a directory. Plug-ins: tests/plugins/task_plugins.py,
tests/plugins/action_plugins.py."""
import pytest

from tests.support.cli import run_trainer

_TASKS = "tests.plugins.task_plugins"
_ACTIONS = "tests.plugins.action_plugins"
_BASE = ["--config=synthetic", "--config.train.steps=20", "--config.data.num_train_examples=64",
         "--config.checkpoint.interval=10"]


def _phase(phase: str):
  return ([f"--config.train.actions={_ACTIONS}:raises_in_phase"],
          {"DISTLOOP_TEST_PHASE": phase})


# (flags, environment, exit code, fragments of the line, checkpoint step said to be intact)
_CASES = {
    "task_assertion": ([f"--config.train.task={_TASKS}:AssertsPastStep3",
                        "--config.train.steps_per_loop=2", "--config.checkpoint.interval=2"],
                       {}, 1, ["AssertsPastStep3.train_step failed in steps 5..6",
                               "assertion failed: [step went past 3]", "(task_plugins.py:"], 4),
    "action_mid_run": ([f"--config.train.actions={_ACTIONS}:raises_at_20"], {}, 1,
                       ["action 'raises_at_20' raised ValueError: no room for step 20",
                        "(action_plugins.py:", "at step 20"], 10),
    "export_wrong_input_spec": ([f"--config.train.task={_TASKS}:ExportsWrongSpec"], {}, 2,
                                ["ExportsWrongSpec.export() cannot be served with input_spec "
                                 "(None, 5)", "Expected shape (None, 28, 28, 1)",
                                 "refused before training"], None),
    # Issue 43: sys.exit(0) there ended the run with exit 0 ("done"), untrained, no line.
    "export_calls_sys_exit": ([f"--config.train.task={_TASKS}:ExitsInExport"], {}, 2,
                              ["ExitsInExport.export called sys.exit(0) (task_plugins.py:"],
                              None),
    "step_calls_sys_exit": ([f"--config.train.task={_TASKS}:ExitsInStep"], {}, 2,
                            ["ExitsInStep's step called sys.exit(0) while tracing"], None),
}
_SLOW_CASES = {
    **{f"action_in_{phase}": (*_phase(phase), 1,
                              ["action 'raises_in_phase' raised RuntimeError: phase work "
                               "failed", "(action_plugins.py:"], step)
       for phase, step in [("restored", None), ("eval", 10), ("export", 20), ("summary", 20)]},
    "string_value": ([f"--config.train.task={_TASKS}:ReturnsAString"], {}, 1,
                     ["ReturnsAString.train_step failed in steps 1..", "string"], None),
    "export_not_a_model": ([f"--config.train.task={_TASKS}:ExportsNotAModel"], {}, 2,
                           ["ExportsNotAModel.export() serves Adam, not a keras.Model"], None),
    "metrics_csv_is_a_directory": (["--config.train.steps=2"], {}, 2,
                                   ["metrics.csv is not a regular file"], None),
}


@pytest.mark.parametrize("case", [*_CASES, *(pytest.param(name, marks=pytest.mark.slow)
                                             for name in _SLOW_CASES)])
def test_user_code_failing_is_one_line(tmp_path, case):
  flags, env, code, fragments, intact = {**_CASES, **_SLOW_CASES}[case]
  model_dir = tmp_path / "run"
  if case == "metrics_csv_is_a_directory":
    (model_dir / "metrics.csv").mkdir(parents=True)
  result = run_trainer(model_dir, *_BASE, *flags, env=env)
  assert result.returncode == code, result.stderr[-3000:]
  assert "Traceback" not in result.stderr, result.stderr[-3000:]
  lines = [line for line in result.error_lines() if "distloop: error" in line]
  assert len(lines) == 1 and lines[0].startswith("distloop: error: "), result.stderr[-3000:]
  for fragment in fragments:
    assert fragment in lines[0], lines[0]
  if code == 2:  # refused before anything was written
    left = sorted(p.name for p in model_dir.iterdir()) if model_dir.exists() else []
    assert left == (["metrics.csv"] if case == "metrics_csv_is_a_directory" else []), left
  elif intact is None:
    assert "no checkpoint yet" in lines[0], lines[0]
  else:
    assert f"the last checkpoint, step {intact}, is intact" in lines[0], lines[0]
    assert (model_dir / "checkpoints" / str(intact)).is_dir()
