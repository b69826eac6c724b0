"""Bad input: one clear line on stderr, exit 2, no traceback, nothing in model_dir."""
import os

import pytest

from tests.cli import FASHION_MNIST_DIR, run_trainer

BAD_INPUTS = {
    "unknown config": (["--config=imagenet_resnet"], "unknown config"),
    "unknown field": (["--config=synthetic", "--config.train.stepz=5"], "unknown config field"),
    "unknown dataset": (["--config=synthetic", "--config.data.name=cifar"], "data.name"),
    "unknown strategy": (["--config=synthetic", "--config.runtime.strategy=horovod"], "runtime.strategy"),
    "unknown optimizer": (["--config=synthetic", "--config.train.optimizer=lion"], "train.optimizer"),
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
