"""checkpoint.init_partial: fine-tuning with a new head loads the weights whose name and
shape match and lists the skipped ones; without it, a mismatch is refused with advice
that fits (the switch), never "use another --model_dir" for a fresh model_dir."""
import os

import numpy as np
import pytest

from tests.support.cli import REPO, run_trainer, train_ok
from tests.support.processes import checkpoint_arrays

_PLUGINS = os.path.join(REPO, "tests", "plugins", "finetune_plugins.py")
_FLAGS = ["--config=synthetic", "--config.train.steps=4", "--config.train.steps_per_loop=2",
          "--config.data.num_train_examples=256", "--config.data.num_eval_examples=64"]


@pytest.fixture(scope="module")
def base(tmp_path_factory):
  model_dir = tmp_path_factory.mktemp("base")
  train_ok(model_dir, *_FLAGS, f"--config.model.name={_PLUGINS}:base")
  return model_dir


def test_init_partial_loads_the_trunk_and_lists_the_new_head(base, tmp_path):
  result = run_trainer(tmp_path, *_FLAGS, f"--config.model.name={_PLUGINS}:fine_tuned",
                       f"--config.checkpoint.init_from={base}",
                       "--config.checkpoint.init_partial=true")
  assert result.returncode == 0, result.stderr[-3000:]
  assert "Traceback" not in result.stderr
  assert "2 of 4 variables" in result.stderr, result.stderr[-3000:]
  assert ("fine_tuned/head/kernel (shape (32, 10) there, (32, 12) here)" in result.stderr
          and "fine_tuned/head/bias (shape (10,) there, (12,) here)" in result.stderr)
  source, tuned = checkpoint_arrays(base, 4), checkpoint_arrays(tmp_path, 4)
  for weight in ("kernel", "bias"):  # frozen after loading: still the base run's
    np.testing.assert_array_equal(tuned[f"model/fine_tuned/trunk/{weight}"],
                                  source[f"model/base/trunk/{weight}"])
  assert tuned["model/fine_tuned/head/kernel"].shape == (32, 12)


def test_a_new_head_without_init_partial_is_refused_with_the_switch_as_advice(base, tmp_path):
  result = run_trainer(tmp_path, *_FLAGS, f"--config.model.name={_PLUGINS}:fine_tuned",
                       f"--config.checkpoint.init_from={base}")
  assert result.returncode == 2, result.stderr[-3000:]
  assert len(result.error_lines()) == 1, result.stderr[-3000:]
  line = result.error_lines()[0]
  assert "checkpoint.init_partial=true" in line and "another --model_dir" not in line
  assert "fine_tuned/" in line  # the first mismatch
  assert not tmp_path.joinpath("checkpoints").exists()


def test_init_partial_with_nothing_matching_is_refused(base, tmp_path):
  result = run_trainer(tmp_path, *_FLAGS, f"--config.checkpoint.init_from={base}",
                       "--config.checkpoint.init_partial=true")  # the built-in CNN
  assert result.returncode == 2, result.stderr[-3000:]
  assert len(result.error_lines()) == 1, result.stderr[-3000:]
  assert "no variable of" in result.error_lines()[0]


def test_init_partial_needs_init_from(tmp_path):
  result = run_trainer(tmp_path, *_FLAGS, "--config.checkpoint.init_partial=true")
  assert result.returncode == 2 and "set checkpoint.init_from" in result.stderr
  assert not tmp_path.joinpath("checkpoints").exists()
