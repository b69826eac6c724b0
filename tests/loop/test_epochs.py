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
    ({"epochs": 2, "steps": 0}, {"name": "tests/plugins/stream_plugins.py:shuffled_stream"},
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
  from tests.support.cli import train_ok  # pylint: disable=g-import-not-at-top
  summary = train_ok(tmp_path, *_SMALL, "--config.train.epochs=2")
  assert summary["step"] == 16


def test_epochs_and_steps_both_on_the_command_line_are_refused(tmp_path):
  from tests.support.cli import run_trainer  # pylint: disable=g-import-not-at-top
  result = run_trainer(tmp_path / "run", *_SMALL, "--config.train.epochs=2",
                       "--config.train.steps=10")
  assert result.returncode == 2, result.stderr
  line, = [line for line in result.stderr.splitlines() if line.strip()]
  assert "train.epochs=2 and train.steps=10 are both set: give one" in line, line
  assert not os.path.exists(tmp_path / "run")


# -- the batch size changed on resume: epochs count the examples used ---------------------

def _tiny(batch: int, **train):
  """The tiny CNN on 512 synthetic examples: an epoch is 16 steps of 32, 8 of 64."""
  config = _config(global_batch_size=batch, **train)
  config.data.num_train_examples = 512
  config.model.conv_filters, config.model.dense_units = 8, 16
  return config


def _logged_epochs(model_dir) -> dict[int, float]:
  with open(model_dir / "metrics.csv", newline="") as f:
    return {int(row["step"]): float(row["value"]) for row in csv.DictReader(f)
            if row["split"] == "train" and row["name"] == "epoch"}


@pytest.fixture(scope="module")
def one_epoch_at_32_then_more_at_64(tmp_path_factory):
  """1 epoch at batch 32 (16 steps), then train.epochs=2, 3 and 3 again at batch 64; the
  summaries, and the state (plain orbax) where the epochs=2 run ended."""
  import trainer  # pylint: disable=g-import-not-at-top
  from tests.support.processes import read_checkpoint  # pylint: disable=g-import-not-at-top
  model_dir = tmp_path_factory.mktemp("epochs_resized")
  runs = []
  for batch, epochs in ((32, 1), (64, 2), (64, 3), (64, 3)):
    runs.append(trainer.run(_tiny(batch, epochs=epochs, steps=0), str(model_dir)))
    if epochs == 2:
      after_two_epochs = read_checkpoint(model_dir, runs[-1]["step"])
  return model_dir, runs, after_two_epochs


def test_epochs_after_a_batch_size_change_count_the_examples_used(
    one_epoch_at_32_then_more_at_64):
  """Epochs are examples: after 1 epoch at batch 32 (512 examples), epochs=2 at batch 64
  is 8 more steps (to step 24), epochs=3 8 more (to 32). Counted in steps of the new batch,
  epochs=2 made 16 steps: "Already finished at step 16", one epoch short, and epochs=3
  stopped at step 24."""
  model_dir, (first, second, third, again), _ = one_epoch_at_32_then_more_at_64
  assert first["step"] == 16
  assert (second["step"], second["trained_steps"]) == (24, 8) and "already_finished" not in second
  assert (third["step"], third["trained_steps"]) == (32, 8)
  assert again.get("already_finished") and again["step"] == 32
  logged = _logged_epochs(model_dir)
  assert (logged[16], logged[24], logged[32]) == (1.0, 2.0, 3.0)
  assert sorted(int(step) for step in os.listdir(model_dir / "checkpoints")) == [16, 24, 32]


def test_epochs_after_a_batch_size_change_train_the_weights_of_the_same_steps(
    one_epoch_at_32_then_more_at_64, tmp_path):
  """The epochs=2 run at batch 64 ends where a run told its steps does (16 steps of 32,
  then 8 of 64 from the data position 512): the same weights and optimizer state at step
  24, by plain orbax. (Counted in steps of 64 it ended at step 16, one epoch short.)"""
  import trainer  # pylint: disable=g-import-not-at-top
  from tests.support import processes  # pylint: disable=g-import-not-at-top
  _, _, after_two_epochs = one_epoch_at_32_then_more_at_64
  trainer.run(_tiny(32, steps=16), str(tmp_path))
  trainer.run(_tiny(64, steps=24), str(tmp_path))
  processes.assert_same_state(after_two_epochs, processes.read_checkpoint(tmp_path, 24),
                              atol=1e-6)


def test_the_last_step_completes_the_epochs_and_says_how_far_past(tmp_path, caplog):
  """512 examples left at batch 96: 6 steps, the last ending 64 examples into the next
  epoch: said in the start-up line, not left to the reader."""
  from trainer.setup import epochs  # pylint: disable=g-import-not-at-top

  class Split:
    def __len__(self):
      return 512

  caplog.set_level(logging.INFO)
  config = _tiny(96, epochs=2, steps=0)
  resolved = epochs.resolved(config, epochs.plan(config, Split()), (16, 512))
  assert resolved.train.steps == 22 and resolved.train.epochs == 0
  assert ("train.epochs=2: 22 steps: from step 16 (512 examples used, epoch 1), 6 more of "
          "global batch 96 to 1024 examples") in caplog.text
  assert "ends 64 example(s) past them (epoch 2.125)" in caplog.text


@pytest.mark.parametrize("value, message", [
    ("nan", "train.epochs=nan must be a finite number >= 0"),
    ("inf", "train.epochs=inf must be a finite number >= 0"),
    ("-inf", "train.epochs=-inf must be a finite number >= 0"),
    ("-1", "train.epochs=-1 must be a finite number >= 0"),
    ("1e400", "train.epochs=inf must be a finite number >= 0"),  # the flag parses it as inf
    ("1e308", "train.epochs=1e+308 is more passes than distloop can count"),
    # Countable passes, but not in examples of this split (known once it is loaded).
    ("1e14", "train.epochs=1e+14 is 2.56e+16 examples of the 256-example training split: "
             "more than"),
], ids=["nan", "inf", "-inf", "-1", "1e400", "1e308", "1e14-of-256"])
def test_epochs_no_run_can_have_are_one_line_and_exit_2(tmp_path, value, message):
  """NaN, an infinity, a negative or an overflowing count of passes: one line, exit 2,
  nothing written (math.ceil raised ValueError/OverflowError: a traceback, exit 1)."""
  from tests.support.cli import run_trainer  # pylint: disable=g-import-not-at-top
  result = run_trainer(tmp_path / "run", *_SMALL, f"--config.train.epochs={value}")
  assert result.returncode == 2, result.stderr
  line, = result.error_lines()
  assert line.startswith("distloop: error: ") and message in line, line
  assert not os.path.exists(tmp_path / "run") or not os.listdir(tmp_path / "run")


def test_a_restore_older_than_the_newest_step_is_refused_then_counted_from(tmp_path):
  """The steps are counted from the newest checkpoint's data position before the model
  is built; when that step proves unreadable and the restore falls back to an older one
  at another batch size, those steps would end the run off its epochs (here 2.5): refused
  in one line, and the next run counts from the step restored."""
  import trainer  # pylint: disable=g-import-not-at-top
  from trainer.errors import UserError  # pylint: disable=g-import-not-at-top
  every_8 = {"epochs": 1, "steps": 0}
  config = _tiny(32, **every_8)
  config.checkpoint.interval = 8
  trainer.run(config, str(tmp_path))  # checkpoints 8 (256 examples) and 16 (512)
  for path in glob.glob(str(tmp_path / "checkpoints" / "16" / "model" / "**" / "d" / "*"),
                        recursive=True):
    with open(path, "r+b") as f:
      f.truncate(8)
  with pytest.raises(UserError) as refused:
    trainer.run(_tiny(64, epochs=2, steps=0), str(tmp_path))
  assert ("train.epochs=2 made 24 steps from the newest checkpoint, but training resumed "
          "from step 8 (256 examples used), where they make 20") in str(refused.value)
  summary = trainer.run(_tiny(64, epochs=2, steps=0), str(tmp_path))
  assert (summary["step"], summary["trained_steps"]) == (20, 12)
  assert _logged_epochs(tmp_path)[20] == 2.0
