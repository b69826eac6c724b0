"""Bad input: one clear line on stderr, exit 2, no traceback, nothing in model_dir."""
import hashlib
import os

import pytest

from tests.support.cli import FASHION_MNIST_DIR, run_trainer

BAD_INPUTS = {
    "unknown config": (["--config=imagenet_resnet"], "unknown config"),
    "unknown field": (["--config=synthetic", "--config.train.stepz=5"], "unknown config field"),
    "unknown field, no --config": (["--config.train.stesp=5"],
                                   "unknown config field --config.train.stesp (did you mean 'steps'?)"),
    "eval of an empty model_dir": (["--mode=eval"], "config.json"),
    "unknown dataset": (["--config=synthetic", "--config.data.name=cifar"], "data.name"),
    "unknown strategy": (["--config=synthetic", "--config.runtime.strategy=horovod"], "runtime.strategy"),
    "unknown optimizer": (["--config=synthetic", "--config.train.optimizer=lions"], "train.optimizer"),
    "unknown mode": (["--config=synthetic", "--mode=dance"], "--mode"),
    "non-numeric batch": (["--config=synthetic", "--config.train.global_batch_size=abc"], "global_batch_size"),
    "zero batch": (["--config=synthetic", "--config.train.global_batch_size=0"], "global_batch_size"),
    "negative steps": (["--config=synthetic", "--config.train.steps=-3"], "train.steps"),
    "non-numeric steps": (["--config=synthetic", "--config.train.steps=many"], "train.steps"),
    "zero steps_per_loop": (["--config=synthetic", "--config.train.steps_per_loop=0"], "steps_per_loop"),
    "zero cpu devices": (["--config=synthetic", "--config.runtime.num_cpu_devices=0"], "num_cpu_devices"),
    "negative learning rate": (["--config=synthetic", "--config.train.learning_rate=-0.01"], "learning_rate"),
    "batch not divisible": (["--config=synthetic", "--config.runtime.strategy=mirrored",
                             "--config.runtime.num_cpu_devices=3",
                             "--config.train.global_batch_size=64"], "not divisible by the 3 replicas"),
    "missing data dir": (["--config=mnist_cnn", "--config.data.dir=/no/such/dir"], "/no/such/dir"),
    "tpu without a tpu": (["--config=synthetic", "--config.runtime.strategy=tpu"], "tpu"),
    "stray argument": (["--config=synthetic", "stray"], "stray"),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_is_one_clear_line(tmp_path, case):
  flags, expected = BAD_INPUTS[case]
  model_dir = tmp_path / "run"
  result = run_trainer(model_dir, *flags, timeout=120)
  assert result.returncode == 2, result.stderr
  lines = result.error_lines()
  assert len(lines) == 1, result.stderr
  assert lines[0].startswith("distloop: error:") and expected in lines[0]
  assert "Traceback" not in result.stderr
  assert not model_dir.exists()


def test_truncated_idx_file_is_named(tmp_path):
  data_dir = tmp_path / "data"
  data_dir.mkdir()
  for name in os.listdir(FASHION_MNIST_DIR):
    raw = open(os.path.join(FASHION_MNIST_DIR, name), "rb").read()
    (data_dir / name).write_bytes(raw[:20_000] if name.startswith("train-images") else raw)
  model_dir = tmp_path / "run"
  result = run_trainer(model_dir, "--config=mnist_cnn", "--config.data.name=fashion_mnist",
                       f"--config.data.dir={data_dir}", timeout=120)
  assert result.returncode == 2
  assert len(result.error_lines()) == 1 and "train-images-idx3-ubyte.gz" in result.stderr
  assert not model_dir.exists()


def test_model_dir_that_is_a_file_is_left_alone(tmp_path):
  model_dir = tmp_path / "notes.txt"
  model_dir.write_text("keep me")
  result = run_trainer(model_dir, "--config=synthetic", timeout=120)
  assert result.returncode == 2
  assert len(result.error_lines()) == 1 and "not a directory" in result.stderr
  assert model_dir.read_text() == "keep me"


_QUICK = ["--config=synthetic", "--config.train.steps=2", "--config.train.steps_per_loop=2",
          "--config.data.num_train_examples=256", "--config.data.num_eval_examples=64"]

BAD_CONFIG_FILES = {
    "syntax error": ("def get_config(:\n", "syntax error at line 1"),
    "get_config raises": ("def get_config():\n  raise ValueError('no such dataset')\n",
                          "get_config() raised ValueError: no such dataset (line 2)"),
    "get_config raises KeyError": ("def get_config():\n  return {}['x']\n",
                                   "get_config() raised KeyError: 'x' (line 2)"),
    "import fails": ("import no_such_module_here\n", "ModuleNotFoundError"),
    "no get_config": ("X = 1\n", "defines no get_config()"),
    "not a ConfigDict": ("def get_config():\n  return {'train': {}}\n",
                         "get_config() returned dict, not an ml_collections.ConfigDict"),
    "missing file": (None, "no such file"),
}


@pytest.mark.parametrize("case", sorted(BAD_CONFIG_FILES))
def test_bad_config_file_is_one_line_naming_it(tmp_path, case):
  """Each: one line naming the file and what is wrong, never `config_config`."""
  source, expected = BAD_CONFIG_FILES[case]
  config = tmp_path / "my_config.py"
  if source is not None:
    config.write_text(source)
  model_dir = tmp_path / "run"
  result = run_trainer(model_dir, f"--config={config}", "--config.train.steps=2", timeout=120)
  assert result.returncode == 2, result.stderr
  lines = result.error_lines()
  assert len(lines) == 1, result.stderr
  assert lines[0].startswith(f"distloop: error: --config={config}") and expected in lines[0]
  assert "config_config" not in lines[0]
  assert not model_dir.exists()


def _tree(path) -> dict:
  """Every entry under `path` (links not followed): its kind and bytes."""
  entries = {}
  for root, directories, files in os.walk(path):
    for name in directories + files:
      full = os.path.join(root, name)
      if os.path.islink(full):
        entries[full] = ("link", os.readlink(full))
      elif os.path.isdir(full):
        entries[full] = ("dir",)
      else:
        entries[full] = ("file", hashlib.sha256(open(full, "rb").read()).hexdigest())
  return entries


def _lock_is_a_directory(model_dir):
  (model_dir / ".lock").mkdir(parents=True)
  return model_dir, ".lock is not a regular file"


def _symbolic_link_loop(model_dir):
  model_dir.parent.mkdir(exist_ok=True)
  model_dir.symlink_to(model_dir)
  return model_dir, "Too many levels of symbolic links"


def _checkpoints_is_a_file(model_dir):
  model_dir.mkdir(parents=True)
  (model_dir / "checkpoints").write_text("notes")
  return model_dir, "checkpoints is not a directory"


@pytest.mark.parametrize("shape", [_lock_is_a_directory, _symbolic_link_loop,
                                   _checkpoints_is_a_file])
def test_model_dir_of_the_wrong_shape_is_one_line_and_left_as_it_is(tmp_path, shape):
  model_dir, expected = shape(tmp_path / "run")
  before = _tree(tmp_path)
  result = run_trainer(model_dir, *_QUICK, timeout=120)
  assert result.returncode == 2, result.stderr[-3000:]
  lines = result.error_lines()
  assert len(lines) == 1 and expected in lines[0], result.stderr[-3000:]
  assert _tree(tmp_path) == before


def test_bad_data_found_in_training_leaves_no_model_dir(tmp_path):
  """The data is refused after the lock was taken (examples change shape midway)."""
  model_dir = tmp_path / "run"
  result = run_trainer(model_dir, *_QUICK, "--config.data.name=tests.plugins.bad_plugins:shape_changes_midway",
                       timeout=120)
  assert result.returncode == 2, result.stderr[-3000:]
  assert len(result.error_lines()) == 1 and "same shape" in result.stderr
  assert not model_dir.exists()
