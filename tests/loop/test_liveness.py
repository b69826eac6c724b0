"""A job always ends (issue 31, defects 7-9): nothing a user writes keeps it alive.

- An Action that blocks (a lock never released, time.sleep(1000)) runs in a thread of
  its own while the main thread keeps the signal protocol: SIGTERM ends the run within
  seconds, exit 42 with the Action's boundary step saved, and a rerun resumes from it;
  without a signal, train.action_timeout_seconds names it in one line (exit 1). On two
  workers the launcher ends when one worker's Action hangs.
- A run that stops early (an Action's "stop") writes finished.json: continuous_eval and
  the evaluator task read it, evaluate that step and exit 0; a rerun is "already
  finished"; trainer.launch --num_evaluators=1 ends.
- The CLI leaves as soon as its files are written (no tf.data teardown after the export).

Every wait has a limit that tells "ends" from "hangs" (TrainerProcess.finish fails a hang).
"""
import json
import os
import re
import signal
import time

import pytest

from tests.support.cli import REPO, run_trainer
from tests.support.processes import TrainerProcess, loopback_only, needs_loopback
from trainer.loop import continuous_eval

_BLOCKING = os.path.join(REPO, "tests", "plugins", "blocking_actions.py")
_STOPPING = os.path.join(REPO, "tests", "plugins", "action_plugins.py")
_FLAGS = ["--config=synthetic", "--config.train.steps=60", "--config.train.global_batch_size=32",
          "--config.train.steps_per_loop=10", "--config.checkpoint.interval=50",
          "--config.data.num_train_examples=640", "--config.data.num_eval_examples=128"]


# -- defect 7: an Action that blocks -------------------------------------------------

@pytest.mark.slow
def test_sigterm_ends_a_blocked_action_with_its_step_saved_and_a_rerun_resumes(tmp_path):
  """Catches: SIGTERM only setting a flag that nobody reads while the Action blocks (the
  job lived on until SIGKILL, losing every step since the last checkpoint)."""
  process = TrainerProcess(tmp_path, *_FLAGS, f"--config.train.actions={_BLOCKING}:block_at_20")
  process.wait_for(r"blocking at step 20")
  signalled = time.monotonic()
  process.send(signal.SIGTERM)
  code = process.finish(timeout=60)
  assert code == 42, process.output[-3000:]
  assert time.monotonic() - signalled < 30  # seconds (a 3 s grace, then the save)
  assert "preempted at step 20; its checkpoint is on disk" in process.output
  assert "action 'block_at_20' at step 20 did not return" in process.output
  assert "Traceback" not in process.output
  assert (tmp_path / "checkpoints" / "20").is_dir()
  resumed = run_trainer(tmp_path, *_FLAGS, f"--config.train.actions={_STOPPING}:stop_at_40",
                        timeout=300)
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert "Restored checkpoint at step 20" in resumed.stderr


@pytest.mark.slow
def test_a_blocked_action_past_its_limit_is_one_line_naming_it(tmp_path):
  """Catches: a boundary that never ends without a signal (no limit on user code)."""
  process = TrainerProcess(tmp_path, *_FLAGS, f"--config.train.actions={_BLOCKING}:block_at_20",
                           "--config.train.action_timeout_seconds=2")
  code = process.finish(timeout=120)
  assert code == 1, process.output[-3000:]
  errors = [line for line in process.lines if line.startswith("distloop: error:")]
  assert errors == [
      "distloop: error: action 'block_at_20' did not return within 2 s at step 20 "
      "(train.action_timeout_seconds): step 20 is saved; ended the run with it still "
      "running\n"], process.output[-3000:]
  assert "Traceback" not in process.output
  assert (tmp_path / "checkpoints" / "20").is_dir()


@pytest.mark.slow
@needs_loopback
def test_two_workers_one_blocked_in_an_action_end_on_sigterm(tmp_path):
  """Catches: the launcher waiting forever for a worker stuck in an Action (or in a
  collective on a worker that left): SIGTERM forwarded, nothing exited."""
  job = TrainerProcess(None, "--num_workers=2", "--", f"--model_dir={tmp_path / 'run'}",
                       *_FLAGS, f"--config.train.actions={_BLOCKING}:block_on_worker_1_at_20",
                       module="trainer.launch", prefix=loopback_only())
  job.wait_for(r"\[worker-1\].*blocking at step 20")
  job.send(signal.SIGTERM)
  code = job.finish(timeout=120)
  assert code == 42, job.output[-4000:]  # ended; the last complete checkpoint is where it resumes
  assert "action 'block_on_worker_1_at_20' at step 20 did not return" in job.output


class _Process:
  """A worker process as the launcher polls it: `code` None while it runs."""

  def __init__(self, code):
    self.code, self.killed = code, False

  def poll(self):
    return self.code

  def send_signal(self, signum):
    if signum == signal.SIGKILL:
      self.kill()

  def wait(self, timeout=None):
    del timeout
    return self.code

  def kill(self):
    self.killed, self.code = True, -9


@pytest.mark.parametrize("other", [None, 1])  # still stuck, or its collective aborted
def test_the_launcher_ends_when_one_worker_stopped_and_the_other_is_stuck(monkeypatch, other):
  """Catches: a launcher waiting forever (or failing the job) for a worker stuck in a
  collective on a peer that stopped with 42 after a forwarded signal."""
  from trainer.cluster import launch, launch_tasks  # pylint: disable=g-import-not-at-top
  launcher = launch.Launcher("trainer", [], num_workers=2, num_ps=0, max_restarts=0)
  launcher.tasks = [launch_tasks.Task("worker", 0, "", _Process(other)),
                    launch_tasks.Task("worker", 1, "", _Process(42))]
  launcher._stopping = True  # pylint: disable=protected-access
  clock = [0.0]
  monkeypatch.setattr(launch.time, "monotonic", lambda: clock[0])
  check = launcher._check_synchronous  # pylint: disable=protected-access
  if other is None:
    assert check() is None  # the others get time to save and exit
    clock[0] = launch._STRAGGLER_SEC  # pylint: disable=protected-access
  assert check() == 42
  assert launcher.tasks[0].process.killed == (other is None)


# -- defect 8: a finished run is recorded, and every waiter reads it -----------------

class _Finished:
  """A sidecar's view of a job whose Action stopped it at step 40 of 60."""

  def __init__(self, at_poll: int):
    self.polls, self.at_poll = 0, at_poll
    self.checkpoints = self
    self.directory = "/nonexistent"
    self.evaluated = []

  def finished(self):
    self.polls += 1
    return 40 if self.polls >= self.at_poll else None

  def reload(self):
    pass

  def all_steps(self):
    return [20, 40]

  def restore(self, step):
    return step

  def evaluate(self, step):
    self.evaluated.append(step)


@pytest.mark.parametrize("at_poll", [1, 3])  # read before step 40 is seen, and after
def test_continuous_eval_ends_at_the_step_training_finished_at(tmp_path, monkeypatch, at_poll):
  """Catches: a sidecar waiting for train.steps after an early stop (exit 1 after
  eval.timeout_seconds, default an hour)."""
  job = _Finished(at_poll)
  monkeypatch.setattr(os.path, "isdir", lambda path: True)
  sleeps = []
  sidecar = continuous_eval.ContinuousEval(job, final_step=60, poll_seconds=1,
                                           timeout_seconds=10, sleep=sleeps.append,
                                           finished=job.finished)
  assert sidecar.run() == job.evaluated == [20, 40]
  assert len(sleeps) == max(at_poll - 2, 0)


_EARLY = [*_FLAGS, "--mode=train_and_eval", "--config.eval.interval=20",
          f"--config.train.actions={_STOPPING}:stop_at_40"]


@pytest.mark.slow
def test_after_an_early_stop_the_sidecar_ends_and_a_rerun_is_a_no_op(tmp_path):
  """Catches: continuous_eval waiting for step 60 of a job that finished at 40, and a rerun
  of the finished job training on."""
  trained = run_trainer(tmp_path, *_EARLY, timeout=300)
  assert trained.returncode == 0, trained.stderr[-3000:]
  sidecar = TrainerProcess(tmp_path, "--mode=continuous_eval", "--config.eval.poll_seconds=0.5",
                           "--config.eval.timeout_seconds=60")
  assert sidecar.finish(timeout=120) == 0, sidecar.output[-3000:]
  assert re.search(r"eval at step 40 \|", sidecar.output)
  record = json.loads((tmp_path / "finished.json").read_text())
  assert record == {"step": 40, "train_steps": 60, "reason": "stopped by stop_at_40"}
  again = run_trainer(tmp_path, *_EARLY, timeout=300)
  assert again.returncode == 0 and "Already finished at step 40" in again.stdout, (
      again.stderr[-3000:])


@pytest.mark.slow
@needs_loopback
def test_the_launcher_with_an_evaluator_ends_after_an_early_stop(tmp_path):
  """Catches: `the job exited with 0`, then the launcher waiting forever on an evaluator
  that waits for train.steps."""
  job = TrainerProcess(None, "--num_workers=1", "--num_evaluators=1", "--",
                       f"--model_dir={tmp_path / 'run'}", *_EARLY,
                       "--config.eval.poll_seconds=0.5", "--config.eval.timeout_seconds=90",
                       module="trainer.launch", prefix=loopback_only())
  code = job.finish(timeout=300)
  assert code == 0, job.output[-4000:]
  assert "[launch] evaluator-0 evaluated the final step (exit 0)" in job.output, job.output[-4000:]
  assert re.search(r"\[evaluator-0\] .*eval at step 40 \|", job.output)


# -- defect 9: the exit comes right after the last write ----------------------------

@pytest.mark.slow
def test_the_process_exits_right_after_summary_json(tmp_path):
  """Catches: the interpreter's teardown after the last write (tf.data's iterators: 20-80 s
  on a busy machine, 0.8-1.4 s on a quiet one; ~0.05 s now), here made certain by a
  plug-in's atexit handler that sleeps 120 s."""
  process = TrainerProcess(tmp_path, *_FLAGS, f"--config.train.actions={_BLOCKING}:slow_exit")
  code = process.finish(timeout=60)
  ended = time.time()
  assert code == 0, process.output[-3000:]
  assert ended - os.path.getmtime(tmp_path / "summary.json") < 10  # generous: ends, not idles
