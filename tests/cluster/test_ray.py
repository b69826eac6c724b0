"""Ray Train (examples/ray_train.py, trainer/ray_train.py): 2 Ray workers on
127.0.0.1 train the weights of 2 local replicas; a worker killed mid-run makes Ray restart
the group, which resumes to the weights of the uninterrupted run; the Result's metrics are
summary.json's and its checkpoint leads to the final step's; bad input is one line before
Ray starts; trainer.run works off the main thread, where Ray runs it.

The Ray jobs run in the private network namespace of the multi-process tests
(tests/support/processes.py): Ray's servers, like TensorFlow's, listen on every address."""
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys

import pytest

from tests.support.cli import REPO, run_trainer, user_environment
from tests.support.processes import (TrainerProcess, assert_same_state, checkpoint_arrays,
                             loopback_only, needs_loopback)

pytestmark = pytest.mark.slow  # python -m pytest -m slow (CI runs these too)

_RAY = importlib.util.find_spec("ray") is not None
needs_ray = pytest.mark.skipif(not _RAY, reason="Ray is not installed (pip install -e "
                               "'.[ray]'; .ci/run installs it for the slow tests)")

_STEPS = 60
# As tests/cluster/test_multi_worker.py, with plain SGD: its updates are proportional to the
# gradient, so equal weights to 1e-6 mean the same gradients, reduced once, at every step.
_FLAGS = ["--config=synthetic", f"--config.train.steps={_STEPS}",
          "--config.train.global_batch_size=48", "--config.train.steps_per_loop=5",
          "--config.checkpoint.interval=20", "--config.data.num_train_examples=1000",
          "--config.data.num_eval_examples=500", "--config.runtime.deterministic=true",
          "--config.train.optimizer=sgd", "--config.train.learning_rate=0.02"]
_TWO_REPLICAS = ["--config.runtime.strategy=mirrored", "--config.runtime.num_cpu_devices=2"]
# Default threading: runtime.deterministic fixes the threads per op in every shape (a Ray
# worker, a launched worker, 2 local replicas), so their summation orders agree.
_RAY_ENV = {"RAY_DEDUP_LOGS": "0",  # every worker's lines, not "[repeated 2x across cluster]"
            "RAY_USAGE_STATS_ENABLED": "0"}
_HANG = 420  # seconds: far above a healthy Ray run here


def _ray_job(model_dir, *flags: str) -> TrainerProcess:
  """The example on 2 Ray workers; what its `result` holds goes to <model_dir>.result.json."""
  return TrainerProcess(None, f"--model_dir={model_dir}", *_FLAGS, *flags, module="tests.support.ray_job",
                        env={**_RAY_ENV, "RAY_JOB_RESULT": f"{model_dir}.result.json"},
                        prefix=loopback_only())


def _ray_result(model_dir) -> dict:
  """What the Ray user read (tests/support/ray_job.py): metrics, checkpoint_dir, dataframe_steps."""
  return json.loads(open(f"{model_dir}.result.json", encoding="utf-8").read())


@pytest.fixture(scope="module")
def two_replicas(tmp_path_factory):
  """One process, two replicas: the weights every Ray run must reach."""
  model_dir = tmp_path_factory.mktemp("two_replicas")
  result = run_trainer(model_dir, *_FLAGS, *_TWO_REPLICAS)
  assert result.returncode == 0, result.stderr[-4000:]
  return checkpoint_arrays(model_dir, _STEPS)


@pytest.fixture(scope="module")
def ray_run(tmp_path_factory):
  """An uninterrupted 2-worker Ray job: (its final state, its output, its model_dir)."""
  if not _RAY:
    pytest.skip("Ray is not installed")
  model_dir = tmp_path_factory.mktemp("ray") / "run"
  job = _ray_job(model_dir, "--num_workers=2")
  assert job.finish(_HANG) == 0, job.output[-4000:]
  return checkpoint_arrays(model_dir, _STEPS), job.output, model_dir


@needs_ray
@needs_loopback
def test_two_ray_workers_reach_the_weights_of_two_replicas(ray_run, two_replicas):
  arrays, output, model_dir = ray_run
  assert re.search(r"Ray Train worker 0 of 2 \(pid \d+.*the chief", output), output[-4000:]
  assert re.search(r"Ray Train worker 1 of 2 \(pid \d+", output), output[-4000:]
  # The CLI's log policy in Ray's workers too: no orbax INFO chatter (158 of 407 lines once).
  chatter = [line for line in output.splitlines()
             if re.search(r"\[process=\d+\]|CheckpointManager|save_device_host|MemoryRegulated",
                          line)]
  assert not chatter, chatter[:5]
  summary = json.loads((model_dir / "summary.json").read_text())
  assert summary["num_replicas"] == 2 and summary["strategy"] == "multi_worker_mirrored"
  assert summary["step"] == _STEPS
  # Plain SGD: equal weights mean the same gradients, reduced once, at every step
  # (measured: bit for bit; a gradient counted twice is off by 1e-2 or more). That
  # trainer.launch's 2 workers reach 2 replicas' weights is tests/cluster/test_multi_worker.py's.
  assert_same_state(arrays, two_replicas, atol=1e-6)


@needs_ray
@needs_loopback
def test_ray_result_holds_the_summary_and_the_final_checkpoint(ray_run):
  """Ray Train V2 keeps the metrics reported with a checkpoint only: result.metrics is
  rank 0's summary.json, result.checkpoint points at the final step's orbax checkpoint,
  and metrics_dataframe has a row per checkpoint.interval (20) step."""
  _, _, model_dir = ray_run
  read = _ray_result(model_dir)
  summary = json.loads((model_dir / "summary.json").read_text())
  assert read["metrics"] == summary, (read["metrics"], summary)
  assert read["metrics"]["step"] == _STEPS and "eval_accuracy" in read["metrics"]
  assert read["checkpoint_dir"] == str(model_dir / "checkpoints" / str(_STEPS))
  assert read["dataframe_steps"] == [20, 40, _STEPS]


@needs_ray
@needs_loopback
def test_a_killed_ray_worker_restarts_the_group_on_the_same_trajectory(tmp_path, ray_run):
  model_dir = tmp_path / "run"
  job = _ray_job(model_dir, "--num_workers=2", "--max_failures=2")
  try:
    pid = int(job.wait_for(r"Ray Train worker 1 of 2 \(pid (\d+)", timeout=_HANG).group(1))
    job.wait_for(r"step 30/60", timeout=_HANG)
    os.kill(pid, signal.SIGKILL)
    assert job.finish(_HANG) == 0, job.output[-4000:]
  finally:
    job.kill()
  restored = re.findall(r"Restored checkpoint at step (\d+)", job.output)
  assert restored and set(restored) <= {"20", "40"}, job.output[-4000:]
  pids = set(re.findall(r"Ray Train worker 1 of 2 \(pid (\d+)", job.output))
  assert len(pids) == 2, pids  # a second group: a new process for worker 1
  assert_same_state(checkpoint_arrays(model_dir, _STEPS), ray_run[0], atol=1e-6)
  read = _ray_result(model_dir)  # the restarted group reported the end
  assert read["metrics"] == json.loads((model_dir / "summary.json").read_text())
  assert read["checkpoint_dir"] == str(model_dir / "checkpoints" / str(_STEPS))


@needs_ray
def test_bad_input_is_one_line_before_ray_starts(tmp_path):
  for flag, words in (("--config.runtime.strategy=parameter_server",
                       "Ray Train starts a cluster of workers only"),
                      ("--mode=export", "a Ray job trains"),
                      ("--config.train.steps=-1", "train.steps")):
    completed = subprocess.run(
        [sys.executable, os.path.join("examples", "ray_train.py"),
         f"--model_dir={tmp_path / 'run'}", "--config=synthetic", flag],
        cwd=REPO, env={**user_environment(), **_RAY_ENV}, capture_output=True, text=True,
        timeout=300)
    assert completed.returncode == 2, completed.stderr[-3000:]
    lines = [line for line in completed.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("distloop: error: "), lines
    assert words in lines[0], lines
    assert not (tmp_path / "run").exists()


_THREAD = r'''
import json, signal, sys, threading
import trainer, configs

config = configs.get("synthetic")
config.train.steps, config.train.steps_per_loop, config.data.num_train_examples = 10, 5, 256
results = {}
def run():
  try:
    results["step"] = trainer.run(config, sys.argv[1], handle_signals=True)["step"]
  except BaseException as e:  # the test prints it
    results["error"] = repr(e)
thread = threading.Thread(target=run)
thread.start()
thread.join()
results["handler"] = signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
print("RESULTS " + json.dumps(results))
'''


def test_trainer_run_off_the_main_thread_installs_no_handler(tmp_path):
  """Ray Train calls the training function in a thread: signal.signal fails there."""
  completed = subprocess.run([sys.executable, "-c", _THREAD, str(tmp_path / "run")], cwd=REPO,
                             env=user_environment(), capture_output=True, text=True, timeout=600)
  assert completed.returncode == 0, completed.stderr[-4000:]
  line = next(text for text in completed.stdout.splitlines() if text.startswith("RESULTS "))
  results = json.loads(line[len("RESULTS "):])
  assert results == {"step": 10, "handler": True}, (results, completed.stderr[-3000:])
  assert "no signal handler installed (not the main thread" in completed.stderr


def test_the_docs_show_the_whole_example():
  with open(os.path.join(REPO, "examples", "ray_train.py")) as f:
    code = f.read()
  with open(os.path.join(REPO, "docs", "scaling-out.md")) as f:
    page = f.read()
  body = code[code.index("import sys"):]
  assert f"```python\n{body}```" in page
  assert len([text for text in body.splitlines() if text.strip()]) <= 15


def test_a_preemption_notice_saves_once_per_notice():
  """Ray's notice (ray.train.get_preemption_info, faked): "save" at the first boundary
  that sees it, then training goes on; a new notice saves again."""
  from trainer import ray_train  # pylint: disable=g-import-not-at-top
  notices = iter([None, None, "node A at 12:00", "node A at 12:00", None, "node B at 13:00"])
  action = ray_train.SaveOnPreemptionNotice(lambda: next(notices))
  boundary = type("Boundary", (), {"step": 5})()
  assert [action(boundary) for _ in range(6)] == [None, None, "save", None, None, "save"]


@needs_ray
def test_a_ray_checkpoint_whose_step_is_gone_is_refused(tmp_path):
  """Rank 0's report carries the pointer, the others' none (the same calls: a barrier);
  checkpoint_dir resolves it to checkpoints/<step>, and refuses it in one line once
  orbax's max_to_keep removed that step (never another step's weights)."""
  from ray.train import Checkpoint  # pylint: disable=g-import-not-at-top
  from trainer import ray_train  # pylint: disable=g-import-not-at-top
  from trainer.errors import UserError  # pylint: disable=g-import-not-at-top
  reported = []

  def report(metrics, checkpoint=None):  # as Ray: the pointer copied before report returns
    if checkpoint is not None:
      kept = shutil.copytree(checkpoint.path, tmp_path / f"ray_{len(reported)}")
      checkpoint = Checkpoint.from_directory(str(kept))
    reported.append((metrics, checkpoint))

  model_dir = tmp_path / "run"
  (model_dir / "checkpoints" / "20").mkdir(parents=True)
  ray_train.Reporter(report, str(model_dir), rank_zero=True).at_end({"step": 20, "eval_loss": 1.5})
  ray_train.Reporter(report, str(model_dir), rank_zero=False).at_end({"step": 20, "eval_loss": 1.5})
  (metrics, pointer), (_, none) = reported
  assert metrics == {"step": 20, "eval_loss": 1.5} and none is None
  assert ray_train.checkpoint_dir(pointer) == str(model_dir / "checkpoints" / "20")
  (model_dir / "checkpoints" / "20").rmdir()
  with pytest.raises(UserError, match="step 20 of this Ray checkpoint is not on disk"):
    ray_train.checkpoint_dir(pointer)
