"""Data a new user brings that distloop cannot train right: one line, exit 2, nothing written.

Unseeded randomness in data.preprocess (a resume would not be exact), batches larger
than the split or than memory, labels that do not fit the model, variable-shape or batched tf.data
streams, a builder returning (x, y), plug-ins calling sys.exit; and the class
count a built-in model takes from the data (model.num_classes=0).
"""
import os
import re
import time

import numpy as np
import PIL.Image
import pytest

from tests.support.cli import REPO, run_trainer, train_ok

_PLUGINS = os.path.join(REPO, "tests", "plugins", "data_plugins.py")
_QUICK = ["--config=synthetic", "--config.train.steps=4", "--config.train.steps_per_loop=2",
          "--config.data.num_train_examples=256", "--config.data.num_eval_examples=64"]


def _preprocess(name):
  return f"--config.data.preprocess={_PLUGINS}:{name}"


def _data(name):
  return f"--config.data.name={_PLUGINS}:{name}"


@pytest.mark.parametrize("flags, message", [
    # Unseeded randomness: named with its stateless replacement.
    ([_preprocess("unseeded_flip")],
     "tf.image.stateless_random_flip_left_right(image, seed=seed)"),
    # (slow: the same check as a fast case beside them)
    pytest.param([_preprocess("unseeded_noise")], "RandomUniform in random_uniform",
                 marks=pytest.mark.slow),
    ([_preprocess("generator_noise")], "RngReadAndSkip"),
    pytest.param([_preprocess("keras_random_flip")], "a Keras random layer",
                 marks=pytest.mark.slow),
    # Batches the split or the machine cannot hold.
    (["--config.train.global_batch_size=1000000000"],
     "train.global_batch_size=1000000000 is larger than the training split (256 examples"),
    (["--config.train.global_batch_size=257"], "use at most 256"),
    ([_data("huge_examples"), "--config.train.global_batch_size=1000000"],
     "train.global_batch_size=1000000 needs at least 1.9 TiB of memory"),
    # Labels and element shapes distloop does not batch.
    # Dict labels (a multi-output model's) that do not fit: one line saying how.
    ([_data("dict_labels_numpy")],
     "the train split's labels are a dict (digit, even), the eval split's one array"),
    pytest.param([_data("dict_labels_stream")],  # (slow: tests/tasks/test_multi_output.py has it)
                 "the labels are a dict (digit, even) but model.name='mnist_cnn' returns one "
                 "tensor", marks=pytest.mark.slow),
    pytest.param([_data("tuple_labels_numpy")],
                 "train split: labels are a tuple of 2; give one label", marks=pytest.mark.slow),
    ([_data("varying_length_stream")], "features has shape [?] per example"),
    ([_data("padded_batch_stream")], "return it unbatched (dataset.unbatch())"),
    ([_data("x_y_instead_of_splits")],
     "must return (train, eval), two splits, got (ndarray, ndarray)"),
    ([_data("float_labels_stream")], "cannot say how many classes it has"),
    # A plug-in that ends the process is an error naming it, not a silent exit 0.
    pytest.param([_preprocess("exiting_preprocess")], "exiting_preprocess' called sys.exit(0)",
                 marks=pytest.mark.slow),
    ([_data("exiting_builder")], "exiting_builder' called sys.exit(0)"),
    pytest.param([f"--config.model.name={_PLUGINS}:exiting_model"],
                 "exiting_model' called sys.exit(0)", marks=pytest.mark.slow),
    pytest.param([f"--config.train.loss={_PLUGINS}:exiting_loss"],
                 "exiting_loss' called sys.exit(3)", marks=pytest.mark.slow),
    ([f"--config.model.name={REPO}/tests/plugins/exiting_at_import.py:build"],
     "called sys.exit(0) while"),
])
def test_refused_in_one_line_before_anything_is_written(tmp_path, flags, message):
  model_dir = tmp_path / "run"
  started = time.monotonic()
  result = run_trainer(model_dir, *_QUICK, *flags, timeout=120)
  assert result.returncode == 2, result.stderr[-3000:]
  assert len(result.error_lines()) == 1, result.stderr[-3000:]
  assert result.stderr.startswith("distloop: error: ") and message in result.stderr, result.stderr
  assert not model_dir.exists()
  assert time.monotonic() - started < 60


def test_a_raising_preprocess_is_a_short_line_without_autograph_text(tmp_path):
  result = run_trainer(tmp_path / "run", *_QUICK,
                       f"--config.data.preprocess={REPO}/tests/plugins/bad_plugins.py:raising_preprocess")
  assert result.returncode == 2, result.stderr[-3000:]
  line, = result.error_lines()
  assert line.endswith("raising_preprocess' raised ValueError: bad augmentation"), line
  assert "in user code" not in line and "File " not in line and len(line) < 200, line


def test_a_failed_read_of_a_shuffled_batch_names_the_examples_truly(tmp_path):
  """Not "reading examples 12..0": the rows of a training batch are shuffled."""
  result = run_trainer(tmp_path / "run", *_QUICK, _data("fails_on_seven"), timeout=120)
  assert result.returncode == 2, result.stderr[-3000:]
  line = result.error_lines()[-1]
  assert re.search(r"reading \d+ examples among 0\.\.255 raised OSError: record 7 is corrupt",
                   line), line


def test_seeded_preprocess_trains(tmp_path):
  summary = train_ok(tmp_path / "run", *_QUICK, _preprocess("seeded_flip"))
  assert summary["step"] == 4


def test_image_folder_takes_its_class_count_from_the_folders(tmp_path):
  """3 class folders, no model.num_classes flag: trains, and the log says where 3 came from."""
  rng = np.random.default_rng(0)
  for name in ("cats", "dogs", "owls"):
    folder = tmp_path / "images" / "train" / name
    folder.mkdir(parents=True)
    for k in range(6):
      PIL.Image.fromarray(rng.integers(0, 255, (8, 8, 3), dtype=np.uint8)).save(
          folder / f"{k}.png")
  model_dir = tmp_path / "run"
  result = run_trainer(model_dir, "--config=image_folder",
                       f"--config.data.dir={tmp_path / 'images'}", "--config.data.image_size=8",
                       "--config.data.eval_fraction=0.34", "--config.train.steps=4",
                       "--config.train.steps_per_loop=2", "--config.train.global_batch_size=4",
                       "--config.model.conv_filters=4", "--config.model.dense_units=8",
                       timeout=180)
  assert result.returncode == 0, result.stderr[-3000:]
  assert "model.num_classes=3, from the data" in result.stderr
  assert (model_dir / "export" / "4").is_dir()


def test_integer_labels_give_the_class_count(tmp_path):
  model_dir = tmp_path / "run"
  result = run_trainer(model_dir, *_QUICK, _data("four_classes"), timeout=120)
  assert result.returncode == 0, result.stderr[-3000:]
  assert "model.num_classes=4, from the data" in result.stderr


def test_batch_bounds_allow_full_batch_and_a_partial_eval_batch():
  from input_pipelines import memory  # pylint: disable=g-import-not-at-top
  from input_pipelines.errors import DataError  # pylint: disable=g-import-not-at-top
  from input_pipelines.sources import ArraySource  # pylint: disable=g-import-not-at-top
  train = ArraySource(np.zeros((256, 1024), np.float32), np.zeros(256, np.int64), where="train")
  evaluation = ArraySource(np.zeros((10, 1024), np.float32), np.zeros(10, np.int64), where="eval")
  memory.check_batches(train, evaluation, train_batch=256, eval_batch=500, available=1 << 40)
  with pytest.raises(DataError, match=r"train.global_batch_size=257 is larger .* use at most 256"):
    memory.check_batches(train, evaluation, train_batch=257, eval_batch=500, available=1 << 40)
  # 2 batches of 128 examples of 4104 bytes: 1026 KiB; the eval batch counts its 10 examples.
  with pytest.raises(DataError, match=r"train.global_batch_size=128 needs at least 1.0 MiB .* "
                                      r"has 1000.0 KiB available"):
    memory.check_batches(train, evaluation, train_batch=128, eval_batch=500, available=1_024_000)
  memory.check_batches(train, evaluation, train_batch=128, eval_batch=500, available=1_024_000,
                       processes=2)  # each of 2 workers holds half of every batch
  assert memory.available_bytes() > 0
