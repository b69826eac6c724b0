"""An opaque tf.data pipeline (a callable data split) resumes by skipping the examples used:
exact when the callable rebuilds the same stream, as this shuffled one does. SIGTERM, resume,
and the weights are those of the uninterrupted run."""
import re

import pytest

from tests.support.cli import REPO, run_trainer, train_ok
from tests.support.processes import TrainerProcess, assert_same_state, checkpoint_arrays

_FLAGS = ["--config=synthetic", f"--config.data.name={REPO}/tests/plugins/stream_plugins.py:shuffled_stream",
          "--config.train.steps=60", "--config.train.global_batch_size=48",
          "--config.train.steps_per_loop=5", "--config.checkpoint.interval=50",
          "--config.data.num_train_examples=1000", "--config.runtime.deterministic=true"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
  model_dir = tmp_path_factory.mktemp("opaque_uninterrupted")
  summary = train_ok(model_dir, *_FLAGS)
  assert summary["eval_accuracy"] > 0.5  # it learns from the stream
  return checkpoint_arrays(model_dir, 60)


@pytest.mark.slow  # a whole training run or two: the fast suite's time (CI runs it)
def test_sigterm_then_resume_skips_to_the_same_examples(tmp_path, uninterrupted):
  process = TrainerProcess(tmp_path, *_FLAGS)
  assert process.stop_at(r"step 25/60") == 42, process.output  # mid-epoch: 20.8 steps an epoch
  stopped_at = int(re.search(r"preempted at step (\d+)", process.output).group(1))
  resumed = run_trainer(tmp_path, *_FLAGS)
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert f"Restored checkpoint at step {stopped_at}" in resumed.stderr
  assert_same_state(checkpoint_arrays(tmp_path, 60), uninterrupted, atol=1e-6)


@pytest.mark.slow  # a process for the exit code and stderr; test_step_values.py has it in-process
@pytest.mark.parametrize("split", ["train", "eval"])
def test_an_empty_stream_is_one_line_exit_2_and_nothing_written(tmp_path, split):
  """Caught: an empty train stream was a StopIteration traceback; an empty eval stream
  reported eval_loss 0.0 and exited 0."""
  result = run_trainer(tmp_path / "run", *_FLAGS, "--config.train.steps=4",
                       f"--config.data.name={REPO}/tests/plugins/stream_plugins.py:empty_{split}_stream")
  assert result.returncode == 2, result.stderr[-3000:]
  lines = result.error_lines()
  assert len(lines) == 1 and lines[0].startswith("distloop: error: "), lines
  assert lines[0].endswith(f"{split} split: the split is empty (the dataset yields no example)")
  assert not (tmp_path / "run").exists()
