"""train.epochs: the run's length in passes over the training split (steps derived from
its size and the global batch), the fractional epoch reported next to the step; given
with train.steps, or for a split of unknown size, refused in one line."""
import csv
import glob
import logging
import os

import pytest



def _scalar(events_file: str, tag: str) -> dict[int, float]:
  """{step: value} of one scalar tag in a TensorBoard events file."""
  from tensorboard.backend.event_processing import event_accumulator  # pylint: disable=g-import-not-at-top
  from tensorboard.util import tensor_util  # pylint: disable=g-import-not-at-top
  accumulator = event_accumulator.EventAccumulator(
      events_file, size_guidance={event_accumulator.TENSORS: 0})
  accumulator.Reload()
  return {event.step: float(tensor_util.make_ndarray(event.tensor_proto))
          for event in accumulator.Tensors(tag)}


def _config(**train):
  """synthetic: 256 training examples in global batches of 32 (8 steps an epoch)."""
  import configs  # pylint: disable=g-import-not-at-top
  config = configs.get("synthetic")
  config.unlock()
  config.data.num_train_examples, config.data.num_eval_examples = 256, 64
  config.train.global_batch_size, config.train.steps_per_loop = 32, 4
  for name, value in train.items():
    setattr(config.train, name, value)
  return config


def test_two_epochs_train_two_passes_of_steps_and_report_the_epoch(tmp_path, caplog):
  import trainer  # pylint: disable=g-import-not-at-top
  caplog.set_level(logging.INFO)
  summary = trainer.run(_config(epochs=2, steps=0), str(tmp_path))
  assert summary["step"] == 16
  assert "train.epochs=2: 16 steps (256 training examples, global batch 32" in caplog.text
  assert "step 8/16 | epoch 1.00 | loss " in caplog.text
  with open(tmp_path / "metrics.csv", newline="") as f:
    logged = {int(row["step"]): float(row["value"]) for row in csv.DictReader(f)
              if row["split"] == "train" and row["name"] == "epoch"}
  assert logged == {4: 0.5, 8: 1.0, 12: 1.5, 16: 2.0}
  events, = glob.glob(str(tmp_path / "tensorboard" / "train" / "events.*"))
  assert _scalar(events, "epoch") == pytest.approx(logged)


@pytest.mark.parametrize("train, data, message", [
    ({"epochs": 2}, {}, "train.epochs=2 and train.steps=300 are both set: give one"),
    ({"epochs": 2, "steps": 0}, {"name": "tests/stream_plugins.py:shuffled_stream"},
     "train.epochs=2 needs a training split of known size"),
])
def test_epochs_the_run_cannot_honour_are_refused_in_one_line(tmp_path, train, data, message):
  import trainer  # pylint: disable=g-import-not-at-top
  from trainer.errors import UserError  # pylint: disable=g-import-not-at-top
  config = _config(**train)
  for name, value in data.items():
    setattr(config.data, name, value)
  with pytest.raises(UserError) as refused:
    trainer.run(config, str(tmp_path / "run"))
  assert message in str(refused.value) and "\n" not in str(refused.value)
  assert not os.path.exists(tmp_path / "run")


_SMALL = ("--config=synthetic", "--config.data.num_train_examples=256",
          "--config.data.num_eval_examples=64", "--config.train.global_batch_size=32",
          "--config.train.steps_per_loop=4")


def test_epochs_on_the_command_line_replace_the_config_files_steps(tmp_path):
  """The built-in configs set train.steps: `--config.train.epochs=2` alone must train by
  epochs (the tutorial's `epochs=5`), not be refused for the file's steps."""
  from tests.cli import train_ok  # pylint: disable=g-import-not-at-top
  summary = train_ok(tmp_path, *_SMALL, "--config.train.epochs=2")
  assert summary["step"] == 16


def test_epochs_and_steps_both_on_the_command_line_are_refused(tmp_path):
  from tests.cli import run_trainer  # pylint: disable=g-import-not-at-top
  result = run_trainer(tmp_path / "run", *_SMALL, "--config.train.epochs=2",
                       "--config.train.steps=10")
  assert result.returncode == 2, result.stderr
  line, = [line for line in result.stderr.splitlines() if line.strip()]
  assert "train.epochs=2 and train.steps=10 are both set: give one" in line, line
  assert not os.path.exists(tmp_path / "run")
