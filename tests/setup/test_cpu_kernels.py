"""distloop turns on oneDNN's CPU kernels on x86-64 (2x-4x the seed CNN's step on an AVX2
CPU, where TensorFlow leaves them off) and leaves the choice to TF_ENABLE_ONEDNN_OPTS when
the user set it."""
import os
import platform
import subprocess
import sys

import pytest

from tests.support import cli

pytestmark = pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"),
                                reason="distloop picks oneDNN on x86-64 only")


def _kernels_of_a_short_run(model_dir, onednn_setting: str | None) -> str:
  env = {k: v for k, v in cli.user_environment().items() if k != "TF_ENABLE_ONEDNN_OPTS"}
  if onednn_setting is not None:
    env["TF_ENABLE_ONEDNN_OPTS"] = onednn_setting
  completed = subprocess.run(
      [sys.executable, "-m", "trainer", "--config=synthetic", f"--model_dir={model_dir}",
       "--config.train.steps=10", "--config.train.steps_per_loop=5",
       "--config.checkpoint.interval=10", "--mode=train"],
      capture_output=True, text=True, timeout=300, cwd=cli.REPO, env=env)
  assert completed.returncode == 0, completed.stderr[-3000:]
  start = next(line for line in completed.stderr.splitlines() if "Training mnist_cnn" in line)
  return "oneDNN" if "oneDNN CPU kernels" in start else "Eigen" if "Eigen CPU kernels" in start \
      else start


def test_onednn_is_on_by_default(tmp_path):
  assert _kernels_of_a_short_run(tmp_path / "default", None) == "oneDNN"


def test_the_users_setting_wins(tmp_path):
  assert _kernels_of_a_short_run(tmp_path / "off", "0") == "Eigen"


def _start_line(model_dir, extra_env=None) -> str:
  """The start-up line of a short run on 2 replicas (logical CPU devices)."""
  env = {**cli.user_environment(), **(extra_env or {})}
  completed = subprocess.run(
      [sys.executable, "-m", "trainer", "--config=synthetic", f"--model_dir={model_dir}",
       "--config.train.steps=10", "--config.train.steps_per_loop=5",
       "--config.checkpoint.interval=10", "--mode=train", "--config.runtime.strategy=mirrored",
       "--config.runtime.num_cpu_devices=2"],
      capture_output=True, text=True, timeout=300, cwd=cli.REPO, env=env)
  assert completed.returncode == 0, completed.stderr[-3000:]
  return next(line for line in completed.stderr.splitlines() if "Training mnist_cnn" in line)


def test_replicas_on_logical_cpus_share_the_cores(tmp_path):
  """Each op of N replicas runs on cores / N threads, not on every core: the replicas' ops
  run side by side instead of contending (1.25x at batch 32 on 2 replicas, 2 cores)."""
  cores = len(os.sched_getaffinity(0))
  line = _start_line(tmp_path / "shared")
  assert f"{max(1, cores // 2)} thread(s) per op" in line, line


def test_the_users_thread_setting_wins(tmp_path):
  line = _start_line(tmp_path / "own", {"TF_NUM_INTRAOP_THREADS": "3"})
  assert "thread(s) per op" not in line, line


def _threads(monkeypatch, cores_env, **runtime_fields) -> int:
  from configs import common  # pylint: disable=g-import-not-at-top
  from trainer.cluster import runtime  # pylint: disable=g-import-not-at-top
  monkeypatch.delenv("TF_NUM_INTRAOP_THREADS", raising=False)
  if cores_env is None:
    monkeypatch.delenv(runtime.CORES_ENV, raising=False)
  else:
    monkeypatch.setenv(runtime.CORES_ENV, cores_env)
  config = common.base_config()
  config.runtime.update(runtime_fields)
  return runtime.threads_per_op_for(config.runtime)


@pytest.mark.parametrize("intra_op_threads,expected", [(0, 1), (3, 3)])
def test_deterministic_threads_per_op_follow_the_config_not_the_shape(
    monkeypatch, intra_op_threads, expected):
  """A summation's order follows the intra-op pool's size: under runtime.deterministic it is
  the config's, the same for 2 local replicas, a launched worker or a lone process."""
  shapes = [(devices, cores) for devices in (1, 2, 4) for cores in (None, "1", "2", "8")]
  assert {_threads(monkeypatch, cores, num_cpu_devices=devices, deterministic=True,
                   intra_op_threads=intra_op_threads) for devices, cores in shapes} == {expected}


def test_otherwise_each_replica_gets_its_share_of_the_process_cores(monkeypatch):
  assert _threads(monkeypatch, "8", num_cpu_devices=2) == 4
  assert _threads(monkeypatch, "1", num_cpu_devices=2) == 1
  assert _threads(monkeypatch, "1", num_cpu_devices=1) == 1  # a launched process's share
  assert _threads(monkeypatch, None, num_cpu_devices=1) == 0  # alone: TF's default, every core
