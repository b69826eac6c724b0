"""A bad plug-in is one line on stderr naming it and the problem, exit 2, nothing written."""
import os

import pytest

from tests.support.cli import REPO, run_trainer

_BAD = os.path.join(REPO, "tests", "plugins", "bad_plugins.py")
_QUICK = ["--config=synthetic", "--config.train.steps=20", "--config.train.steps_per_loop=10",
          "--config.data.num_train_examples=256", "--config.data.num_eval_examples=64"]


@pytest.mark.parametrize("flags, message", [
    (["--config.model.name=no_such_module:build"], "cannot import no_such_module"),
    (["--config.model.name=/no/such/file.py:build"], "no such file /no/such/file.py"),
    ([f"--config.model.name={_BAD}:missing"], "has no 'missing'"),
    ([f"--config.model.name={_BAD}:raising_model"], "raised RuntimeError: cannot build"),
    ([f"--config.model.name={_BAD}:not_a_model"], "returned str, not a keras.Model"),
    ([f"--config.model.name={_BAD}:five_classes"], "labels outside 0..4"),
    ([f"--config.data.name={_BAD}:labels_out_of_range", "--config.model.num_classes=10"],
     "labels outside 0..9 (found 0..12)"),
    ([f"--config.data.name={_BAD}:wrong_batch_axis"], "axis 0 must be the 2 examples"),
    ([f"--config.data.name={_BAD}:not_splits"], "must return (train, eval)"),
    ([f"--config.train.loss={_BAD}:scalar_loss"], "must return one value per example"),
    (["--config.train.loss=hinge"], "train.loss='hinge' is unknown"),
    (["--config.eval.metrics=accuracy,accuracy"], "given twice"),
    ([f"--config.data.preprocess={_BAD}:raising_preprocess"], "raised ValueError: bad augmentation"),
    (["--config.train.loss=mean_squared_error", "--config.eval.metrics=mean_absolute_error"],
     "mean_squared_error needs outputs of the labels' shape"),
])
def test_bad_plugin_is_one_line_and_nothing_is_written(tmp_path, flags, message):
  model_dir = tmp_path / "run"
  result = run_trainer(model_dir, *_QUICK, *flags)
  assert result.returncode == 2, result.stderr[-3000:]
  assert len(result.error_lines()) == 1, result.stderr[-3000:]
  assert result.stderr.startswith("distloop: error: ") and message in result.stderr
  assert not model_dir.exists()


def test_a_source_that_changes_shape_midway_is_named(tmp_path):
  result = run_trainer(tmp_path / "run", *_QUICK,
                       f"--config.data.name={_BAD}:shape_changes_midway")
  assert result.returncode == 2, result.stderr[-3000:]
  assert len(result.error_lines()) == 1, result.stderr[-3000:]
  assert "train split: features of " in result.stderr and "examples among" in result.stderr
  assert "float32[27, 27, 1], the first ones float32[28, 28, 1]" in result.stderr
