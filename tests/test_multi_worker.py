"""Beyond one process, through `python -m trainer.launch` on loopback: two workers train
the weights of two local replicas, survive a killed worker, stop together on SIGTERM
and resume on a different cluster shape; the parameter-server job survives a lost
worker; Slurm's environment is read; central_storage equals mirrored."""
import json
import os
import re
import signal
import socket
import subprocess
import sys

import pytest

from tests.cli import REPO, run_trainer, train_ok
from tests.processes import (TrainerProcess, assert_same_state, checkpoint_arrays,
                             loopback_only, needs_loopback)

_STEPS = 60
# Deterministic kernels; 1,000 examples at batch 48, so step 25 is mid-epoch.
_FLAGS = ["--config=synthetic", f"--config.train.steps={_STEPS}",
          "--config.train.global_batch_size=48", "--config.train.steps_per_loop=5",
          "--config.checkpoint.interval=20", "--config.data.num_train_examples=1000",
          "--config.data.num_eval_examples=500", "--config.runtime.deterministic=true"]
_TWO_REPLICAS = ["--config.runtime.strategy=mirrored", "--config.runtime.num_cpu_devices=2"]


def _launch(model_dir, *launcher_flags: str, trainer_flags=_FLAGS) -> TrainerProcess:
  return TrainerProcess(None, *launcher_flags, "--", f"--model_dir={model_dir}", *trainer_flags,
                        module="trainer.launch", prefix=loopback_only())


def _pid_of(process: TrainerProcess, task: str) -> int:
  pids = re.findall(rf"started {task} \(pid (\d+)\)", process.output)
  assert pids, process.output[-3000:]
  return int(pids[-1])


@pytest.fixture(scope="module")
def two_replicas(tmp_path_factory):
  """Final state of one process with two replicas: what every cluster shape must reach."""
  model_dir = tmp_path_factory.mktemp("two_replicas")
  train_ok(model_dir, *_FLAGS, *_TWO_REPLICAS)
  return checkpoint_arrays(model_dir, _STEPS)


@needs_loopback
def test_two_workers_reach_the_weights_of_two_replicas(tmp_path, two_replicas):
  job = _launch(tmp_path, "--num_workers=2")
  try:
    assert job.wait() == 0, job.output[-3000:]
  finally:
    job.kill()
  assert "[worker-0]" in job.output and "[worker-1]" in job.output
  summary = json.loads((tmp_path / "summary.json").read_text())
  assert summary["num_replicas"] == 2 and summary["strategy"] == "multi_worker_mirrored"
  assert_same_state(checkpoint_arrays(tmp_path, _STEPS), two_replicas, atol=1e-5)


@needs_loopback
def test_a_killed_worker_restarts_the_group_on_the_same_trajectory(tmp_path, two_replicas):
  job = _launch(tmp_path, "--num_workers=2", "--max_restarts=2")
  try:
    job.wait_for(r"\[worker-1\].*step 30/")
    os.kill(_pid_of(job, "worker-1"), signal.SIGKILL)
    assert job.wait() == 0, job.output[-3000:]
  finally:
    job.kill()
  assert "restarting the group (restart 1 of 2)" in job.output
  assert re.search(r"\[worker-0\].*Restored checkpoint at step (20|40)", job.output)
  assert_same_state(checkpoint_arrays(tmp_path, _STEPS), two_replicas, atol=1e-5)


@needs_loopback
def test_sigterm_stops_every_worker_at_one_step_and_one_process_resumes(tmp_path, two_replicas):
  job = _launch(tmp_path, "--num_workers=2")
  try:
    job.wait_for(r"\[worker-0\].*step 25/")
    job.send(signal.SIGTERM)
    assert job.wait() == 42, job.output[-3000:]
  finally:
    job.kill()
  stopped = {task: int(step) for task, step in
             re.findall(r"\[(worker-\d)\].*preempted at step (\d+)", job.output)}
  assert set(stopped) == {"worker-0", "worker-1"} and len(set(stopped.values())) == 1
  step = stopped["worker-0"]
  assert step % 20 and str(step) in os.listdir(tmp_path / "checkpoints")

  # Elastic: the job goes on in one process with two local replicas.
  resumed = run_trainer(tmp_path, *_FLAGS, *_TWO_REPLICAS)
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert f"Restored checkpoint at step {step}" in resumed.stderr
  assert_same_state(checkpoint_arrays(tmp_path, _STEPS), two_replicas, atol=1e-5)


@needs_loopback
def test_parameter_server_job_survives_a_lost_worker(tmp_path):
  flags = ["--config=synthetic", "--config.train.steps=300", "--config.checkpoint.interval=100",
           "--config.train.steps_per_loop=25"]
  job = _launch(tmp_path, "--num_workers=2", "--num_ps=1", trainer_flags=flags)
  try:
    job.wait_for(r"\[chief-0\].*step 100/")
    os.kill(_pid_of(job, "worker-1"), signal.SIGKILL)
    assert job.wait() == 0, job.output[-3000:]
  finally:
    job.kill()
  assert re.search(r"worker-1 .*restarting it", job.output)
  summary = json.loads((tmp_path / "summary.json").read_text())
  assert summary["step"] == 300 and summary["strategy"] == "parameter_server"
  assert summary["eval_accuracy"] >= 0.9
  arrays = checkpoint_arrays(tmp_path, 300)  # plain orbax, no distloop
  assert arrays["model/mnist_cnn/conv/kernel"].shape == (3, 3, 1, 32)


@needs_loopback
def test_slurm_environment_makes_a_two_worker_cluster(tmp_path, two_replicas):
  """Two Slurm tasks of one step on one node (SLURM_PROCID 0 and 1), no TF_CONFIG."""
  with socket.socket() as probe:
    probe.bind(("127.0.0.1", 0))
    port_base = probe.getsockname()[1]
  trainer = [sys.executable, "-m", "trainer", f"--model_dir={tmp_path}", *_FLAGS,
             "--config.runtime.strategy=multi_worker_mirrored",
             f"--config.runtime.slurm_port_base={port_base}"]
  # Both tasks in one shell, so that they share one (private) network.
  both = ('SLURM_PROCID=0 "$0" "$@" & a=$!; SLURM_PROCID=1 "$0" "$@" & b=$!; '
          'wait $a; ra=$?; wait $b; exit $((ra | $?))')
  slurm = {"SLURM_JOB_ID": "1", "SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_NODELIST": "127.0.0.1",
           "SLURM_STEP_TASKS_PER_NODE": "2"}
  env = {key: value for key, value in os.environ.items() if key != "TF_CONFIG"}
  completed = subprocess.run([*loopback_only(), "sh", "-c", both, *trainer], cwd=REPO,
                             env={**env, **slurm}, capture_output=True, text=True, timeout=300)
  assert completed.returncode == 0, completed.stderr[-3000:]
  assert json.loads((tmp_path / "summary.json").read_text())["num_replicas"] == 2
  assert_same_state(checkpoint_arrays(tmp_path, _STEPS), two_replicas, atol=1e-5)


def test_central_storage_trains_like_mirrored(tmp_path, two_replicas):
  summary = train_ok(tmp_path, *_FLAGS, "--config.runtime.strategy=central_storage",
                     "--config.runtime.num_cpu_devices=2")
  assert summary["num_replicas"] == 2
  assert_same_state(checkpoint_arrays(tmp_path, _STEPS), two_replicas, atol=1e-5)
