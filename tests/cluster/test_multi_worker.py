"""Beyond one process, through `python -m trainer.launch` on loopback: two workers train
the weights of two local replicas, survive a killed worker, stop together on SIGTERM
and resume on a different cluster shape, cut their loops at a profile window's edges,
roll back to one agreed step; a chief + worker cluster (TF_CONFIG, as Kubeflow starts
it) stops together and resumes, and saves by the chief's clock; the parameter-server
job survives a lost worker; Slurm's environment is read; central_storage equals mirrored.

Every multi-process wait has a timeout: a hang in a collective fails the test."""
import glob
import json
import os
import re
import signal
import socket
import subprocess
import sys
import types

import numpy as np
import pytest

from tests.support.cli import FASHION_MNIST_DIR, REPO, run_trainer, train_ok
from tests.support.processes import (TrainerProcess, assert_same_state, checkpoint_arrays,
                             loopback_only, needs_loopback)
from tests.support.profiles import step_markers

pytestmark = pytest.mark.slow  # python -m pytest -m slow (CI runs these too)

_STEPS = 60
# Deterministic kernels; 1,000 examples at batch 48, so step 25 is mid-epoch.
_FLAGS = ["--config=synthetic", f"--config.train.steps={_STEPS}",
          "--config.train.global_batch_size=48", "--config.train.steps_per_loop=5",
          "--config.checkpoint.interval=20", "--config.data.num_train_examples=1000",
          "--config.data.num_eval_examples=500", "--config.runtime.deterministic=true"]
_TWO_REPLICAS = ["--config.runtime.strategy=mirrored", "--config.runtime.num_cpu_devices=2"]


_HANG = 240  # seconds: far above a healthy two-process run here (~40 s)


def _launch(model_dir, *launcher_flags: str, trainer_flags=_FLAGS) -> TrainerProcess:
  return TrainerProcess(None, *launcher_flags, "--", f"--model_dir={model_dir}", *trainer_flags,
                        module="trainer.launch", prefix=loopback_only())


def _chief_and_worker(model_dir, chief_flags=(), worker_flags=(),
                      trainer_flags=_FLAGS) -> TrainerProcess:
  """A `chief` and one `worker` under TF_CONFIG (tests/support/cluster.py), the Kubeflow shape."""
  tasks = json.dumps([["chief", list(chief_flags)], ["worker", list(worker_flags)]])
  return TrainerProcess(None, tasks, "--", f"--model_dir={model_dir}", *trainer_flags,
                        "--config.runtime.strategy=multi_worker_mirrored",
                        module="tests.support.cluster", prefix=loopback_only())


def _steps_logged(job: TrainerProcess, task: str) -> list[int]:
  return [int(step) for step in re.findall(rf"\[{task}\].* step (\d+)/", job.output)]


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
def test_a_sigkilled_worker_is_named_in_one_line_and_the_survivor_says_it_lost_it(tmp_path):
  """Catches (issue 43): the launcher blaming the survivor (`worker-0 exited with 1`: its
  collective failed on the killed worker-1, both seen in one poll) and the survivor's
  55-line gRPC traceback instead of one line."""
  flags = ["--config=synthetic", "--config.model.conv_filters=8", "--config.model.dense_units=16",
           "--config.train.steps=400", "--config.train.steps_per_loop=5",
           "--config.checkpoint.interval=50", "--config.data.num_train_examples=1000",
           "--config.data.num_eval_examples=200"]
  job = _launch(tmp_path, "--num_workers=2", "--max_restarts=1", trainer_flags=flags)
  try:
    job.wait_for(r"\[worker-1\].*step 50/", timeout=_HANG)
    killed = _pid_of(job, "worker-1")
    os.kill(killed, signal.SIGKILL)  # mid-training: 350 steps to go
  except BaseException:
    job.kill()
    raise
  assert job.finish(_HANG) == 0, job.output[-3000:]  # after one restart
  restarts = [line for line in job.lines if line.startswith("[launch] ") and "restart" in line]
  assert len(restarts) == 1 and re.fullmatch(
      rf"\[launch\] worker-1 \(pid {killed}\) was killed by SIGKILL after logging step \d+; "
      r"restarting the group \(restart 1 of 1\) from the latest checkpoint\n", restarts[0]), (
          job.output[-3000:])
  assert "Traceback" not in job.output, job.output[-6000:]
  survivor = [line for line in job.lines if line.startswith("[worker-0] distloop: error:")]
  assert len(survivor) == 1 and re.match(
      r"\[worker-0\] distloop: error: lost a peer worker at step \d+ \(\w+Error: .+\): the "
      r"launcher or the cluster restarts the group from the latest checkpoint$", survivor[0]), (
          job.output[-3000:])
  assert json.loads((tmp_path / "summary.json").read_text())["step"] == 400


@needs_loopback
def test_sigterm_stops_every_worker_at_one_step_and_one_process_resumes(tmp_path, two_replicas):
  job = _launch(tmp_path, "--num_workers=2")
  assert job.stop_at(r"\[worker-0\].*step 25/") == 42, job.output[-3000:]
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


def test_profile_window_cuts_every_workers_loops_at_its_edges(tmp_path, two_replicas):
  """Window edges 12 and 17 are not loop boundaries (every 5 steps): every worker must
  stop its loop there too, and at each step between (one step per loop, each with its
  step marker), or their collectives no longer pair up and the job hangs. The chief
  traces (trainer/loop/profiling.py says why not every worker), and the 1-step loops
  leave the weights as they are."""
  job = _launch(tmp_path, "--num_workers=2", "--max_restarts=0",
                trainer_flags=[*_FLAGS, "--config.runtime.profile_steps=12,17"])
  assert job.finish(_HANG) == 0, job.output[-3000:]
  boundaries = _steps_logged(job, "worker-0")
  assert set(range(12, 18)) <= set(boundaries) and _steps_logged(job, "worker-1") == boundaries
  traces = glob.glob(f"{tmp_path}/tensorboard/**/*.xplane.pb", recursive=True)
  assert len(traces) == 1, traces  # the chief's only
  assert step_markers(traces[0]) == dict.fromkeys(range(13, 18), 1)
  assert_same_state(checkpoint_arrays(tmp_path, _STEPS), two_replicas, atol=1e-5)


def test_rollback_restores_the_same_step_on_every_worker(tmp_path):
  """A NaN example in step 27 (tests/plugins/faults.py): both workers roll back to step 20 and
  skip past it, like one process with two replicas, to the same weights."""
  flags = [*_FLAGS, "--config.train.nonfinite_policy=rollback",
           "--config.data.preprocess=tests.plugins.faults:nan_example"]
  reference = tmp_path / "two_replicas"
  train_ok(reference, *flags, *_TWO_REPLICAS)
  job = _launch(tmp_path / "two_workers", "--num_workers=2", "--max_restarts=0",
                trainer_flags=flags)
  assert job.finish(_HANG) == 0, job.output[-3000:]
  for task in ("worker-0", "worker-1"):
    rolled_back = re.findall(rf"\[{task}\].*in steps 26..30: rolled back to step (\d+) and "
                             r"skipped the data up to example 1440", job.output)
    assert rolled_back == ["20"], (task, job.output[-3000:])
  assert_same_state(checkpoint_arrays(tmp_path / "two_workers", _STEPS),
                    checkpoint_arrays(reference, _STEPS), atol=1e-5)


@pytest.mark.parametrize("cluster, task, workers, chief", [
    ({"chief": ["a:1"], "worker": ["b:1"]}, ("worker", 0), 2, False),
    ({"chief": ["a:1"], "worker": ["b:1"]}, ("chief", 0), 2, True),
    ({"worker": ["a:1", "b:1"]}, ("worker", 0), 2, True),
    ({"worker": ["a:1"]}, ("worker", 0), 1, True),
], ids=["worker-beside-a-chief", "chief-beside-a-worker", "two-workers", "one-worker"])
def test_every_chief_and_worker_task_counts(monkeypatch, cluster, task, workers, chief):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from trainer.cluster import runtime  # pylint: disable=g-import-not-at-top
  monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": cluster,
                                              "task": {"type": task[0], "index": task[1]}}))
  strategy = types.SimpleNamespace(
      cluster_resolver=tf.distribute.cluster_resolver.TFConfigClusterResolver())
  assert runtime.num_workers(strategy) == workers and runtime.is_chief(strategy) == chief


def test_chief_and_worker_stop_together_and_resume(tmp_path, two_replicas):
  """TF_CONFIG with a `chief` and one `worker` is a two-task cluster: SIGTERM to the chief
  alone stops both at one step; the same cluster resumes to the uninterrupted weights."""
  job = _chief_and_worker(tmp_path)
  try:
    job.wait_for(r"\[chief-0\].*step 25/", timeout=_HANG)
  except AssertionError:
    job.kill()
    raise
  os.kill(_pid_of(job, "chief-0"), signal.SIGTERM)
  assert job.finish(_HANG) == 42, job.output[-3000:]
  stopped = {task: int(step) for task, step in
             re.findall(r"\[(\w+-0)\].*preempted at step (\d+)", job.output)}
  assert set(stopped) == {"chief-0", "worker-0"} and len(set(stopped.values())) == 1, stopped
  step = stopped["chief-0"]
  assert step % 20 and str(step) in os.listdir(tmp_path / "checkpoints")

  resumed = _chief_and_worker(tmp_path)
  assert resumed.finish(_HANG) == 0, resumed.output[-3000:]
  for task in ("chief-0", "worker-0"):
    assert re.search(rf"\[{task}\].*Restored checkpoint at step {step} ", resumed.output), task
  assert_same_state(checkpoint_arrays(tmp_path, _STEPS), two_replicas, atol=1e-5)


def test_saves_by_wall_time_follow_the_chiefs_clock(tmp_path):
  """checkpoint.interval_seconds on the chief's clock: here the chief's interval has always
  passed and the worker's never does, as if their clocks disagreed; both save together."""
  flags = [*_FLAGS, "--config.train.steps=20", "--config.checkpoint.max_to_keep=10"]
  job = _chief_and_worker(tmp_path, chief_flags=["--config.checkpoint.interval_seconds=1e-9"],
                          worker_flags=["--config.checkpoint.interval_seconds=1e9"],
                          trainer_flags=flags)
  assert job.finish(_HANG) == 0, job.output[-3000:]
  for task in ("chief-0", "worker-0"):
    saved = [int(s) for s in re.findall(rf"\[{task}\].*checkpoint.interval_seconds passed on "
                                        r"the chief's clock: saving step (\d+)", job.output)]
    assert saved == [5, 10, 15], (task, job.output[-3000:])
  assert sorted(int(s) for s in os.listdir(tmp_path / "checkpoints")) == [5, 10, 15, 20]


# Cluster-shape invariance as users run it: default threading (no TF_NUM_INTRAOP_THREADS),
# long enough for a summation order that followed the shape to show (a ReLU or max-pool tie
# going the other way: 1e-4 on the synthetic CNN and 8e-3 on Fashion-MNIST by step 200 when
# a worker process ran each op on 2 threads and each of 2 local replicas on 1), plain SGD.
_LONG_STEPS = 300
_LONG_FLAGS = {
    "synthetic": ["--config=synthetic", "--config.data.num_train_examples=1000",
                  "--config.data.num_eval_examples=500", "--config.train.global_batch_size=48"],
    "fashion_mnist": ["--config=mnist_cnn", "--config.data.name=fashion_mnist",
                      f"--config.data.dir={FASHION_MNIST_DIR}", "--config.eval.interval=0",
                      "--config.data.num_eval_examples=500"],
}
_LONG_COMMON = [f"--config.train.steps={_LONG_STEPS}", "--config.train.steps_per_loop=25",
                "--config.checkpoint.interval=100", "--config.runtime.deterministic=true",
                "--config.train.optimizer=sgd", "--config.train.learning_rate=0.05"]


def _long_flags(workload: str) -> list[str]:
  return [*_LONG_FLAGS[workload], *_LONG_COMMON]


def _max_difference(actual: dict, expected: dict) -> float:
  assert actual.keys() == expected.keys()
  return max(float(np.max(np.abs(actual[key] - expected[key]))) for key in expected)


@pytest.fixture(scope="module", params=sorted(_LONG_FLAGS))
def long_two_replicas(request, tmp_path_factory):
  """(workload, final state) of 300 steps on one process with two replicas."""
  assert "TF_NUM_INTRAOP_THREADS" not in os.environ  # default threading, as users run it
  model_dir = tmp_path_factory.mktemp(f"long_two_replicas_{request.param}")
  train_ok(model_dir, *_long_flags(request.param), *_TWO_REPLICAS)
  return request.param, checkpoint_arrays(model_dir, _LONG_STEPS)


@needs_loopback
def test_two_workers_equal_two_replicas_for_300_steps_with_default_threads(
    tmp_path, long_two_replicas):
  workload, expected = long_two_replicas
  job = _launch(tmp_path, "--num_workers=2", trainer_flags=_long_flags(workload))
  assert job.finish(2 * _HANG) == 0, job.output[-3000:]
  difference = _max_difference(checkpoint_arrays(tmp_path, _LONG_STEPS), expected)
  print(f"{workload}: 2 workers vs 2 replicas, max abs difference {difference:.3g}")
  assert difference <= 1e-6, workload


@needs_loopback
def test_preempted_two_workers_resume_as_two_replicas_on_the_same_trajectory(
    tmp_path, long_two_replicas):
  workload, expected = long_two_replicas
  flags = _long_flags(workload)
  job = _launch(tmp_path, "--num_workers=2", trainer_flags=flags)
  assert job.stop_at(r"\[worker-0\].*step 150/", timeout=2 * _HANG) == 42, job.output[-3000:]
  step = int(re.search(r"preempted at step (\d+)", job.output).group(1))
  assert 150 <= step < _LONG_STEPS
  resumed = run_trainer(tmp_path, *flags, *_TWO_REPLICAS)
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert f"Restored checkpoint at step {step}" in resumed.stderr
  difference = _max_difference(checkpoint_arrays(tmp_path, _LONG_STEPS), expected)
  print(f"{workload}: 2 workers preempted at {step}, resumed as 2 replicas: max abs "
        f"difference {difference:.3g} from the uninterrupted run")
  assert difference <= 1e-6, workload


@pytest.mark.parametrize("model_flags", [
    ["--config.model.name=mlp"],  # Dropout: a seed state each replica assigns
    ["--config.model.name=tests.plugins.batchnorm_plugins:conv_batchnorm",  # moving statistics
     "--config.data.name=tests.plugins.batchnorm_plugins:images"],
], ids=["dropout", "batchnorm"])
def test_central_storage_trains_like_mirrored_with_state_each_replica_assigns(tmp_path,
                                                                             model_flags):
  """Variables each replica assigns on its own (aggregation NONE): under central_storage
  their one copy took no replica's assignment, and the built-in task failed while tracing
  (exit 2, "You must specify an aggregation method"). Now the first replica's assignment
  is kept, as mirrored keeps the first replica's copy: the same weights and statistics."""
  flags = [*_FLAGS, *model_flags, "--config.runtime.num_cpu_devices=2"]
  train_ok(tmp_path / "mirrored", *flags, "--config.runtime.strategy=mirrored")
  summary = train_ok(tmp_path / "central", *flags, "--config.runtime.strategy=central_storage")
  assert summary["num_replicas"] == 2
  assert_same_state(checkpoint_arrays(tmp_path / "central", _STEPS),
                    checkpoint_arrays(tmp_path / "mirrored", _STEPS), atol=1e-5)
