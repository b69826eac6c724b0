"""A model_dir (or a checkpoints/ in it) that cannot be created or written is found at
start-up, before anything is written: bad input (exit 2, one line), not a traceback nor a
failure at the first save after the training. Root writes through any permission bits:
as root the trainer runs without CAP_DAC_OVERRIDE (setpriv), so chmod means what it
says."""
import os
import re
import shutil
import stat
import subprocess
import sys

import pytest

from tests.support.cli import REPO, train_ok, user_environment

_FLAGS = ["--config=synthetic", "--config.train.steps_per_loop=2",
          "--config.data.num_train_examples=256", "--config.data.num_eval_examples=64"]
_NO_ROOT_OVERRIDE = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--"]


def _run_unprivileged(model_dir, *flags):
  prefix = _NO_ROOT_OVERRIDE if os.geteuid() == 0 else []
  return subprocess.run([*prefix, sys.executable, "-m", "trainer", f"--model_dir={model_dir}",
                         *flags], capture_output=True, text=True, timeout=300, cwd=REPO,
                        env=user_environment())


@pytest.mark.skipif(os.geteuid() == 0 and not shutil.which("setpriv"),
                    reason="as root, needs setpriv(1) to drop CAP_DAC_OVERRIDE")
def test_read_only_checkpoints_fail_before_training(tmp_path):
  model_dir = tmp_path / "run"
  train_ok(model_dir, *_FLAGS, "--config.train.steps=2", timeout=300)
  checkpoints = model_dir / "checkpoints"
  checkpoints.chmod(stat.S_IRUSR | stat.S_IXUSR | stat.S_IRGRP | stat.S_IXGRP)
  try:
    result = _run_unprivileged(model_dir, *_FLAGS, "--config.train.steps=40")
  finally:
    checkpoints.chmod(0o755)
  assert result.returncode == 2, result.stderr[-3000:]
  errors = [line for line in result.stderr.splitlines() if line.startswith("distloop: error:")]
  assert len(errors) == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
  assert f"cannot write files to {checkpoints}: Permission denied" in errors[0]
  assert "found at start-up, nothing was written" in errors[0]
  assert "Training " not in result.stderr  # refused before the first step
  assert sorted(os.listdir(checkpoints)) == ["2"]
  assert not (model_dir / ".lock").exists()


@pytest.mark.parametrize("model_dir, refused", [
    ("/proc/distloop_x", r"cannot create --model_dir=/proc/distloop_x: No such file or directory"),
    ("/proc/distloop_x/run", r"cannot create --model_dir=/proc/distloop_x/run: No such file or "
                             r"directory"),
    ("/sys/distloop_x", r"cannot create --model_dir=/sys/distloop_x: Operation not permitted"),
    ("/proc/self", r"cannot write the writer lock to /proc/self/\.lock: No such file or "
                   r"directory"),
], ids=["proc", "proc-nested", "sys", "proc-self"])
def test_a_model_dir_that_cannot_be_created_is_bad_input(model_dir, refused):
  """/proc and /sys take no new directory (ENOENT, EPERM): one line, exit 2, not the
  writer lock's FileNotFoundError traceback (exit 1)."""
  pseudo_file_system = "/" + model_dir.split("/")[1]
  if not os.path.ismount(pseudo_file_system):
    pytest.skip(f"no {pseudo_file_system} mounted here")
  result = subprocess.run([sys.executable, "-m", "trainer", "--config=synthetic",
                           f"--model_dir={model_dir}", "--config.train.steps=2"],
                          capture_output=True, text=True, timeout=300, cwd=REPO,
                          env=user_environment())
  assert result.returncode == 2, result.stderr[-3000:]
  errors = [line for line in result.stderr.splitlines() if line.startswith("distloop: error:")]
  assert len(errors) == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
  assert re.search(refused + r"; found at start-up, nothing was written: make it writable, or "
                   r"use another --model_dir$", errors[0]), errors[0]
  assert not os.path.exists("/proc/distloop_x") and not os.path.exists("/sys/distloop_x")
