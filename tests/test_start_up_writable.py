"""A checkpoints/ that cannot be written is found at start-up (exit 1, one line), not at
the first save after the training. Root writes through any permission bits: as root the
trainer runs without CAP_DAC_OVERRIDE (setpriv), so chmod means what it says."""
import os
import shutil
import stat
import subprocess
import sys

import pytest

from tests.cli import REPO, train_ok, user_environment

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
  assert result.returncode == 1, result.stderr[-3000:]
  errors = [line for line in result.stderr.splitlines() if line.startswith("distloop: error:")]
  assert len(errors) == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
  assert f"cannot write files to {checkpoints}: Permission denied" in errors[0]
  assert "found at start-up: nothing was trained" in errors[0]
  assert "Training " not in result.stderr  # refused before the first step
  assert sorted(os.listdir(checkpoints)) == ["2"]
  assert not (model_dir / ".lock").exists()
