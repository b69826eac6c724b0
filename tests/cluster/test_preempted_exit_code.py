"""--preempted_exit_code: a scheduler that retries only some codes (a Kubeflow TFJob's
ExitCode policy: >= 128) gets the one it retries, from the trainer and the launcher."""
import re
import signal

import pytest

from tests.support.cli import run_trainer
from tests.support.processes import TrainerProcess
from tests.cluster.test_launch import _launch, _launched, state_dir  # noqa: F401  (a fixture)
from trainer import errors

_FLAGS = ["--config=synthetic", "--config.train.steps=40", "--config.train.global_batch_size=32",
          "--config.train.steps_per_loop=5", "--config.checkpoint.interval=20",
          "--config.data.num_train_examples=640", "--config.data.num_eval_examples=64"]


@pytest.mark.parametrize("value, expected", [
    ("0", "0 already means done"), ("1", "1 already means a failure"),
    ("2", "2 already means bad input"), ("256", "3..255"), ("-5", "3..255"),
    ("abc", "not an integer"),
])
def test_a_bad_code_is_one_line_and_exit_2(tmp_path, value, expected):
  """Catches a code that would read as success, failure or bad input to a scheduler, or
  one an exit status cannot carry (256 would exit 0)."""
  model_dir = tmp_path / "run"
  result = run_trainer(model_dir, "--config=synthetic", f"--preempted_exit_code={value}",
                       timeout=120)
  assert result.returncode == 2, result.stderr
  (line,) = result.error_lines()
  assert line.startswith("distloop: error: --preempted_exit_code=") and expected in line, line
  assert not model_dir.exists()


def test_the_code_is_read_in_both_flag_forms():
  assert errors.preempted_exit_code_in(["--a=1", "--preempted_exit_code=143"]) == "143"
  assert errors.preempted_exit_code_in(["--preempted_exit_code", "130", "--b"]) == "130"
  assert errors.preempted_exit_code_in(["--config=synthetic"]) is None


@pytest.mark.slow  # a training run, signalled and resumed (about 25 s)
def test_sigterm_exits_with_the_configured_code_and_the_same_command_resumes(tmp_path):
  """Catches a preemption that still exits 42 (a TFJob with ExitCode would then never
  restart it), or one whose checkpoint is missing."""
  model_dir = tmp_path / "run"
  flags = [*_FLAGS, "--preempted_exit_code=143"]
  process = TrainerProcess(model_dir, *flags)
  try:
    process.wait_for(r"step (1\d|2\d)/40")
    process.send(signal.SIGTERM)
    assert process.wait(timeout=120) == 143, process.output[-3000:]
  finally:
    process.kill()
  assert "then exiting 143" in process.output
  stopped_at = int(re.search(r"preempted at step (\d+)", process.output).group(1))
  assert 10 <= stopped_at < 40
  assert (model_dir / "checkpoints" / str(stopped_at)).is_dir()
  resumed = run_trainer(model_dir, *flags, timeout=300)
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert f"Restored checkpoint at step {stopped_at}" in resumed.stderr


def test_the_launcher_takes_the_configured_code_as_preempted(state_dir):  # pylint: disable=redefined-outer-name
  """Catches a launcher that reads 143 as a failure and restarts the group."""
  result = _launch(state_dir, "--num_workers=2",
                   task_flags=["--then=exit:143", "--preempted_exit_code=143"])
  assert result.returncode == 143, result.stderr
  assert "restart" not in result.stderr
  assert _launched(result.stderr) == {"worker-0": 1, "worker-1": 1}


def test_the_launcher_refuses_a_bad_code_in_one_line(state_dir):  # pylint: disable=redefined-outer-name
  result = _launch(state_dir, "--num_workers=2", task_flags=["--preempted_exit_code=1"])
  assert result.returncode == 2, result.stderr
  (line,) = [text for text in result.stderr.splitlines() if text.strip()]
  assert line.startswith("distloop.launch: error: --preempted_exit_code=1")
  assert not _launched(result.stderr)
