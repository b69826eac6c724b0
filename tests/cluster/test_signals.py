"""SIGTERM at any moment, not only inside the training loop: 1 s after start (imports),
during the restore, during the final eval and while the final export runs. Each ends
as 42 or 0 with no traceback, and the job resumed with the same command ends with the
weights of an uninterrupted run (deterministic kernels, <= 1e-6).

Phases are reached through a test's Action (tests/plugins/hold_actions.py, train.actions): the
trainer logs `test hold at PHASE` and waits for a file; the test signals it, then creates
the file.
"""
import os
import re
import signal
import time

import pytest

from tests.support.cli import REPO, run_trainer, train_ok
from tests.support.processes import (TrainerProcess, assert_same_state, checkpoint_arrays,
                             loopback_only, needs_loopback)
from trainer.loop import continuous_eval
from trainer.errors import Preempted

pytestmark = pytest.mark.slow  # python -m pytest -m slow (CI runs these too)

_STEPS = 60
_FLAGS = ["--config=synthetic", f"--config.train.steps={_STEPS}",
          "--config.train.global_batch_size=48", "--config.train.steps_per_loop=5",
          "--config.checkpoint.interval=20", "--config.data.num_train_examples=1000",
          "--config.data.num_eval_examples=500", "--config.runtime.deterministic=true"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
  model_dir = tmp_path_factory.mktemp("uninterrupted")
  train_ok(model_dir, *_FLAGS)
  return checkpoint_arrays(model_dir, _STEPS)


_HOLD = f"--config.train.actions={os.path.join(REPO, 'tests', 'plugins', 'hold_actions.py')}:hold"


def _held(model_dir, hold_file, phase: str, *flags: str) -> TrainerProcess:
  return TrainerProcess(model_dir, *_FLAGS, *flags, _HOLD, env={
      "DISTLOOP_TEST_HOLD": phase, "DISTLOOP_TEST_HOLD_FILE": str(hold_file)})


def _signal_at_hold(process: TrainerProcess, hold_file, phase: str) -> int:
  """Waits for the hold, sends SIGTERM, lets the trainer go on; returns its exit code."""
  try:
    process.wait_for(rf"test hold at {phase}")
    process.send(signal.SIGTERM)
    process.wait_for(r"SIGTERM: stopping at the next safe point")  # handled, not fatal
    hold_file.touch()
    return process.wait()
  finally:
    process.kill()


def _assert_clean(output: str) -> None:
  assert "Traceback" not in output, output[-3000:]


def _resume_and_compare(model_dir, uninterrupted) -> None:
  resumed = run_trainer(model_dir, *_FLAGS)
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert_same_state(checkpoint_arrays(model_dir, _STEPS), uninterrupted, atol=1e-6)


def _cpu_seconds(pid: int) -> float:
  """CPU time the process has used (Linux: utime + stime in /proc/PID/stat)."""
  with open(f"/proc/{pid}/stat") as f:
    fields = f.read().rsplit(")", 1)[1].split()
  return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_sigterm_one_second_after_start(tmp_path, uninterrupted):
  started = time.monotonic()
  process = TrainerProcess(tmp_path, *_FLAGS)
  try:
    # The acceptance case is a time, not a phase: 1 s in, the trainer is still
    # importing (TensorFlow alone takes longer), before anything could log. On a
    # loaded machine 1 s of wall time may not even start the interpreter, so it also
    # waits for 0.5 s of the trainer's own CPU time (still deep in the imports).
    while time.monotonic() - started < 1.0 or _cpu_seconds(process.process.pid) < 0.5:
      time.sleep(0.01)
    process.send(signal.SIGTERM)
    code = process.wait()
  finally:
    process.kill()
  assert code in (0, 42), f"exit {code}\n{process.output[-3000:]}"
  _assert_clean(process.output)
  _resume_and_compare(tmp_path, uninterrupted)


def test_sigterm_during_restore_exits_42_at_the_restored_step(tmp_path, uninterrupted):
  first = TrainerProcess(tmp_path, *_FLAGS)
  assert first.stop_at(r"step 25/") == 42, first.output[-3000:]
  stopped_at = int(re.search(r"preempted at step (\d+)", first.output).group(1))

  hold_file = tmp_path.parent / f"{tmp_path.name}.go"
  restoring = _held(tmp_path, hold_file, "restored")
  assert _signal_at_hold(restoring, hold_file, "restored") == 42, restoring.output[-3000:]
  _assert_clean(restoring.output)
  assert f"preempted at step {stopped_at}; its checkpoint is on disk" in restoring.output
  assert not re.search(r"step \d+/", restoring.output)  # it trained nothing
  _resume_and_compare(tmp_path, uninterrupted)


def test_sigterm_during_the_final_eval_exits_42_with_the_final_step_saved(tmp_path,
                                                                           uninterrupted):
  hold_file = tmp_path.parent / f"{tmp_path.name}.go"
  process = _held(tmp_path, hold_file, "eval")
  assert _signal_at_hold(process, hold_file, "eval") == 42, process.output[-3000:]
  _assert_clean(process.output)
  assert f"preempted at step {_STEPS}; its checkpoint is on disk" in process.output
  assert not (tmp_path / "summary.json").exists()
  assert_same_state(checkpoint_arrays(tmp_path, _STEPS), uninterrupted, atol=1e-6)
  _resume_and_compare(tmp_path, uninterrupted)
  assert (tmp_path / "summary.json").exists() and (tmp_path / "export" / str(_STEPS)).is_dir()


def test_sigterm_while_the_final_export_runs_finishes_it(tmp_path, uninterrupted):
  hold_file = tmp_path.parent / f"{tmp_path.name}.go"
  process = _held(tmp_path, hold_file, "export")
  assert _signal_at_hold(process, hold_file, "export") == 0, process.output[-3000:]
  _assert_clean(process.output)
  assert (tmp_path / "export" / str(_STEPS) / "saved_model.pb").exists()
  assert not (tmp_path / "export" / f"{_STEPS}.tmp").exists()
  again = run_trainer(tmp_path, *_FLAGS)
  assert again.returncode == 0 and "Already finished" in again.stdout, again.stderr[-3000:]
  assert_same_state(checkpoint_arrays(tmp_path, _STEPS), uninterrupted, atol=1e-6)


@needs_loopback
def test_two_workers_signalled_during_start_up_agree_and_resume(tmp_path, tmp_path_factory):
  """Under MultiWorkerMirroredStrategy a start-up signal waits for the first agreed
  check (a worker leaving alone would hang the other in a collective); TensorFlow's
  runtime installs a SIGTERM handler of its own, which the trainer takes back."""
  reference = tmp_path_factory.mktemp("two_replicas")
  train_ok(reference, *_FLAGS, "--config.runtime.strategy=mirrored",
           "--config.runtime.num_cpu_devices=2")
  job = TrainerProcess(None, "--num_workers=2", "--", f"--model_dir={tmp_path}", *_FLAGS,
                       module="trainer.launch", prefix=loopback_only())
  try:
    job.wait_for(r"\[launch\] started worker-1")
    time.sleep(1.0)  # as above: a time, not a phase (the workers are importing)
    job.send(signal.SIGTERM)
    code = job.wait()
  finally:
    job.kill()
  assert code in (0, 42), job.output[-3000:]
  assert "Traceback" not in job.output and "restarting" not in job.output, job.output[-3000:]
  resumed = run_trainer(tmp_path, *_FLAGS, "--config.runtime.strategy=mirrored",
                        "--config.runtime.num_cpu_devices=2")
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert_same_state(checkpoint_arrays(tmp_path, _STEPS), checkpoint_arrays(reference, _STEPS),
                    atol=1e-5)


class _FakeTrainer:
  """Just enough of a Trainer for continuous_eval: no checkpoint ever appears."""

  class checkpoints:  # pylint: disable=invalid-name
    directory = "/nonexistent"


def test_continuous_eval_stops_on_a_signal_instead_of_polling_on():
  requests = iter([False, False, True])
  sleeps = []
  sidecar = continuous_eval.ContinuousEval(
      _FakeTrainer(), final_step=100, poll_seconds=5, timeout_seconds=0,
      sleep=sleeps.append, stopped=lambda: next(requests))
  with pytest.raises(Preempted):
    sidecar.run()
  assert sleeps == [5, 5]
