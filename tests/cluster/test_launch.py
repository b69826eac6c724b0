"""`python -m trainer.launch`: ports, TF_CONFIG, logs, signals, restarts, exit codes.

The launcher runs `tests.support.fake_task` (no TensorFlow, starts in milliseconds) instead of
the trainer; the fake records its pid, TF_CONFIG, argv and the signals it gets in a
state directory, and does what the test asks (`--then`, `--task=NAME=ACTION`). Every
test ends by checking that no process it started is still alive.
"""
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from tests.support.cli import REPO
from tests.support.processes import TrainerProcess

_READY = r"\[(\S+)\] task \S+ \d+ of cluster (.*) ready"


def _args(state_dir, *launcher_flags, task_flags=()):
  return ["--trainer_module=tests.support.fake_task", *launcher_flags, "--", f"--state_dir={state_dir}",
          *task_flags]


def _launch(state_dir, *launcher_flags, task_flags=()) -> subprocess.CompletedProcess:
  command = [sys.executable, "-m", "trainer.launch", *_args(state_dir, *launcher_flags,
                                                             task_flags=task_flags)]
  return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=60)


def _start(state_dir, *launcher_flags, task_flags=()) -> TrainerProcess:
  """The launcher in the background; its stdout and stderr come merged, line by line."""
  return TrainerProcess(None, *_args(state_dir, *launcher_flags, task_flags=task_flags),
                        module="trainer.launch")


def _wait_ready(process: TrainerProcess, names: set[str]) -> None:
  ready = set()
  while not names <= ready:
    ready.add(process.wait_for(_READY, timeout=20).group(1))


def _launched(log: str) -> dict[str, int]:
  """{task name: times the launcher started it}, from its log: a task stopped with its
  group may be killed before it records its own start."""
  names = re.findall(r"\[launch\] started (\S+) \(pid", log)
  return {name: names.count(name) for name in sorted(set(names))}


def _starts(state_dir) -> dict[str, list[int]]:
  """{task name: pids of its starts, in order}."""
  path = os.path.join(state_dir, "pids")
  starts = {}
  if os.path.exists(path):
    with open(path) as f:
      for line in f.read().splitlines():
        name, pid, _ = line.split()
        starts.setdefault(name, []).append(int(pid))
  return starts


def _recorded(state_dir, name: str) -> dict:
  with open(os.path.join(state_dir, f"{name}.json")) as f:
    return json.load(f)


def _signals(state_dir) -> list[str]:
  path = os.path.join(state_dir, "signals")
  if not os.path.exists(path):
    return []
  with open(path) as f:
    return f.read().splitlines()


def _alive(pid: int) -> bool:
  try:
    with open(f"/proc/{pid}/stat") as f:
      return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie is dead
  except FileNotFoundError:
    return False


@pytest.fixture
def state_dir(tmp_path):
  """The fake tasks' state directory; afterwards, every process they ran must be gone."""
  yield tmp_path
  pids = [pid for pids in _starts(tmp_path).values() for pid in pids]
  deadline = time.monotonic() + 5  # only a killed launcher's children need a moment
  while any(map(_alive, pids)) and time.monotonic() < deadline:
    time.sleep(0.05)
  left = [pid for pid in pids if _alive(pid)]
  for pid in left:
    os.kill(pid, signal.SIGKILL)
  assert not left, f"processes left behind: {left}"


def _assert_loopback_cluster(cluster: dict, shape: dict) -> None:
  assert {kind: len(addresses) for kind, addresses in cluster.items()} == shape
  addresses = [a for kind in cluster for a in cluster[kind]]
  assert all(re.fullmatch(r"127\.0\.0\.1:\d+", a) for a in addresses), addresses
  assert len(set(addresses)) == len(addresses)


def test_synchronous_cluster_logs_and_exit_0(state_dir):
  result = _launch(state_dir, "--num_workers=2", task_flags=["--config.train.steps=7"])
  assert result.returncode == 0, result.stderr

  cluster = _recorded(state_dir, "worker-0")["tf_config"]["cluster"]
  _assert_loopback_cluster(cluster, {"worker": 2})
  for i in range(2):
    recorded = _recorded(state_dir, f"worker-{i}")
    assert recorded["tf_config"] == {"cluster": cluster, "task": {"type": "worker", "index": i}}
    assert recorded["argv"] == [f"--state_dir={state_dir}", "--config.train.steps=7",
                                "--config.runtime.strategy=multi_worker_mirrored"]
    # Child stdout -> stdout, child stderr -> stderr, every line prefixed.
    assert f"[worker-{i}] task worker {i} of cluster {json.dumps(cluster)} ready\n" in result.stdout
    assert f"[worker-{i}] worker-{i} also writes to stderr\n" in result.stderr
  assert "also writes to stderr" not in result.stdout
  assert all(line.startswith(("[worker-0] ", "[worker-1] ", "[launch] "))
             for line in result.stderr.splitlines())
  assert "[launch] the job exited with 0" in result.stderr
  assert {name: len(pids) for name, pids in _starts(state_dir).items()} == {"worker-0": 1,
                                                                            "worker-1": 1}


@pytest.mark.parametrize("launcher_flags,processes", [
    (("--num_workers=2",), 2), (("--num_workers=3", "--num_ps=1"), 5),
    (("--num_workers=2", "--num_evaluators=1"), 3)])
def test_each_process_gets_its_share_of_the_cores(state_dir, launcher_flags, processes):
  """N processes on one machine that each ran every op on every core would oversubscribe
  the cores N times: the launcher tells each its share (DISTLOOP_CORES, read by
  trainer/cluster/runtime.py)."""
  env = {k: v for k, v in os.environ.items() if k != "TF_NUM_INTRAOP_THREADS"}
  command = [sys.executable, "-m", "trainer.launch", *_args(state_dir, *launcher_flags)]
  result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=60, env=env)
  assert result.returncode == 0, result.stderr
  share = str(max(1, len(os.sched_getaffinity(0)) // processes))
  recorded = {name: _recorded(state_dir, name)["cores"] for name in _starts(state_dir)}
  assert len(recorded) == processes and set(recorded.values()) == {share}, recorded


def test_the_users_thread_setting_is_left_to_the_trainers(state_dir):
  env = {**os.environ, "TF_NUM_INTRAOP_THREADS": "3"}
  command = [sys.executable, "-m", "trainer.launch", *_args(state_dir, "--num_workers=2")]
  result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=60, env=env)
  assert result.returncode == 0, result.stderr
  assert [_recorded(state_dir, f"worker-{i}")["cores"] for i in range(2)] == [None, None]


def test_parameter_server_cluster_and_chief_success_stops_servers(state_dir):
  result = _launch(state_dir, "--num_workers=2", "--num_ps=1",
                   task_flags=["--config.runtime.strategy=parameter_server"])
  assert result.returncode == 0, result.stderr

  cluster = _recorded(state_dir, "chief-0")["tf_config"]["cluster"]
  _assert_loopback_cluster(cluster, {"chief": 1, "worker": 2, "ps": 1})
  for kind, index in (("chief", 0), ("worker", 0), ("worker", 1), ("ps", 0)):
    recorded = _recorded(state_dir, f"{kind}-{index}")
    assert recorded["tf_config"] == {"cluster": cluster, "task": {"type": kind, "index": index}}
    assert recorded["argv"] == [f"--state_dir={state_dir}",  # kept, not appended twice
                                "--config.runtime.strategy=parameter_server"]
    assert f"[{kind}-{index}] task {kind} {index} of cluster" in result.stdout
  # The chief exited 0 by itself; the servers were stopped with SIGTERM.
  assert sorted(_signals(state_dir)) == ["ps-0 SIGTERM", "worker-0 SIGTERM", "worker-1 SIGTERM"]


def test_crashed_worker_restarts_the_group(state_dir):
  result = _launch(state_dir, "--num_workers=2", task_flags=["--task=worker-1=crash_once"])
  assert result.returncode == 0, result.stderr
  assert re.search(r"\[launch\] worker-1 \(pid \d+\) was killed by SIGKILL; restarting the "
                   r"group \(restart 1 of 3\) from the latest checkpoint\n", result.stderr)
  starts = _starts(state_dir)
  assert len(starts["worker-0"]) == 2 and len(starts["worker-1"]) == 2
  clusters = re.findall(r"\[worker-0\] task worker 0 of cluster (.*) ready", result.stdout)
  assert len(clusters) == 2
  for cluster in clusters:
    _assert_loopback_cluster(json.loads(cluster), {"worker": 2})


def test_gives_up_after_max_restarts(state_dir):
  result = _launch(state_dir, "--num_workers=2", "--max_restarts=1",
                   task_flags=["--task=worker-1=crash"])
  assert result.returncode == 1, result.stderr
  assert "restarting the group (restart 1 of 1)" in result.stderr
  assert re.search(r"\[launch\] worker-1 \(pid \d+\) was killed by SIGKILL; giving up after "
                   r"1 restarts \(--max_restarts=1\)", result.stderr)
  assert len(_starts(state_dir)["worker-1"]) == 2


def test_exit_2_is_not_retried_and_stops_the_others(state_dir):
  result = _launch(state_dir, "--num_workers=2",
                   task_flags=["--then=until_signal", "--task=worker-1=exit:2"])
  assert result.returncode == 2, result.stderr
  assert "restart" not in result.stderr
  assert _launched(result.stderr) == {"worker-0": 1, "worker-1": 1}


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_a_signal_is_forwarded_to_the_workers_and_exit_42(state_dir, signum):
  """SIGHUP too: a closed terminal or a dropped ssh session is a preemption, not the
  launcher's death (which would SIGKILL every trainer, work since the last checkpoint lost)."""
  process = _start(state_dir, "--num_workers=2", task_flags=["--then=until_signal"])
  try:
    _wait_ready(process, {"worker-0", "worker-1"})
    process.send(signum)
    assert process.wait(timeout=20) == 42, process.output
  finally:
    process.kill()
  name = signal.Signals(signum).name
  assert sorted(_signals(state_dir)) == [f"worker-0 {name}", f"worker-1 {name}"]
  assert f"[worker-1] worker-1 stopping on {name}" in process.output
  assert "restarting" not in process.output


@pytest.mark.parametrize("launcher_flags, starting_task", [
    (["--num_workers=2"], "worker-1"),
    (["--num_workers=1", "--num_ps=1"], "chief-0"),
])
def test_a_trainer_killed_by_the_forwarded_signal_was_preempted_exit_42(
    state_dir, launcher_flags, starting_task):
  """A trainer still starting up (no handler yet) dies of the SIGTERM the launcher
  forwards: the job was preempted, not failed (its latest complete checkpoint is on
  disk), so the launcher exits 42 and restarts nothing."""
  process = _start(state_dir, *launcher_flags,
                   task_flags=["--then=until_signal", f"--task={starting_task}=starting"])
  try:
    _wait_ready(process, {"worker-0", starting_task})
    process.send(signal.SIGTERM)
    assert process.wait(timeout=20) == 42, process.output
  finally:
    process.kill()
  assert "[launch] the job exited with 42" in process.output
  assert "restart" not in process.output.replace("no restarts from now on", "")


def test_sigint_in_parameter_server_mode_goes_to_the_chief_only(state_dir):
  process = _start(state_dir, "--num_workers=1", "--num_ps=1", task_flags=["--then=until_signal"])
  try:
    _wait_ready(process, {"chief-0", "worker-0", "ps-0"})
    process.send(signal.SIGINT)
    assert process.wait(timeout=20) == 42, process.output
  finally:
    process.kill()
  # The chief first; the servers only once it has exited, and with SIGTERM.
  received = _signals(state_dir)
  assert received[0] == "chief-0 SIGINT"
  assert sorted(received[1:]) == ["ps-0 SIGTERM", "worker-0 SIGTERM"]


def test_dead_worker_server_restarts_alone_on_its_port(state_dir):
  process = _start(state_dir, "--num_workers=2", "--num_ps=1",
                   task_flags=["--then=until_go", "--task=worker-1=crash_once"])
  try:
    process.wait_for(r"\[launch\] worker-1 \(pid \d+\) was killed by SIGKILL; "
                     r"restarting it \(restart 1 of 3\)", timeout=20)
    _wait_ready(process, {"worker-1"})
    (state_dir / "go").touch()  # now the chief may finish
    assert process.wait(timeout=20) == 0, process.output
  finally:
    process.kill()
  starts = _starts(state_dir)
  assert {name: len(pids) for name, pids in starts.items()} == {
      "chief-0": 1, "worker-0": 1, "worker-1": 2, "ps-0": 1}
  configs = re.findall(r"\[worker-1\] task worker 1 of cluster (.*) ready", process.output)
  assert len(configs) == 2 and configs[0] == configs[1]  # same ports, same TF_CONFIG
  assert "restarting the group" not in process.output


def test_dead_ps_restarts_the_group(state_dir):
  process = _start(state_dir, "--num_workers=1", "--num_ps=1",
                   task_flags=["--then=until_go", "--task=ps-0=crash_once"])
  try:
    process.wait_for(r"\[launch\] ps-0 \(pid \d+\) was killed by SIGKILL; "
                     r"restarting the group \(restart 1 of 3\)", timeout=20)
    _wait_ready(process, {"chief-0", "worker-0", "ps-0"})
    (state_dir / "go").touch()
    assert process.wait(timeout=20) == 0, process.output
  finally:
    process.kill()
  assert _launched(process.output) == {"chief-0": 2, "worker-0": 2, "ps-0": 2}


def test_failed_chief_restarts_the_group(state_dir):
  result = _launch(state_dir, "--num_workers=1", "--num_ps=1",
                   task_flags=["--task=chief-0=crash_once"])
  assert result.returncode == 0, result.stderr
  assert re.search(r"\[launch\] chief-0 \(pid \d+\) was killed by SIGKILL; restarting the "
                   r"group", result.stderr)
  assert len(_starts(state_dir)["chief-0"]) == 2


def test_children_die_with_a_killed_launcher(state_dir):
  process = _start(state_dir, "--num_workers=2", task_flags=["--then=until_signal"])
  try:
    _wait_ready(process, {"worker-0", "worker-1"})
  finally:
    process.kill()  # SIGKILL: no chance to clean up; the kernel kills the children
  # The state_dir fixture checks that both workers are gone.


@pytest.mark.parametrize("launcher_flags, trainer_flags, message", [
    (["--num_workers=2"], ["--config.runtime.strategy=parameter_server"],
     "--num_ps=0 runs multi_worker_mirrored; the flags ask for parameter_server"),
    (["--num_workers=2", "--num_ps=1"], ["--config.runtime.strategy", "mirrored"],
     "--num_ps=1 runs parameter_server; the flags ask for mirrored"),
])
def test_conflicting_strategy_flag_exits_2(state_dir, launcher_flags, trainer_flags, message):
  result = _launch(state_dir, *launcher_flags, task_flags=trainer_flags)
  assert result.returncode == 2
  assert result.stderr.splitlines() == [f"distloop.launch: error: {message}"]
  assert not _starts(state_dir)


@pytest.mark.parametrize("launcher_flags", [
    [], ["--num_workers=0"], ["--num_workers=2", "--num_ps=-1"],
    ["--num_workers=2", "--max_restarts=-1"], ["--num_workers=2", "--no_such_flag=1"],
    ["--num_workers=two"], ["--num_workers=2", "stray"],
])
def test_bad_launcher_flag_exits_2_with_one_line(state_dir, launcher_flags):
  result = _launch(state_dir, *launcher_flags)
  assert result.returncode == 2
  lines = result.stderr.splitlines()
  assert len(lines) == 1 and lines[0].startswith("distloop.launch: error: "), result.stderr
  assert not _starts(state_dir)


# -- the evaluator task (--num_evaluators=1) ------------------------------------------


def test_the_evaluator_is_listed_in_every_tf_config_and_awaited(state_dir):
  """Catches: an evaluator missing from the workers' TF_CONFIG (TF's convention lists it
  everywhere), one started as a worker, and a launcher that returns (killing it) as soon as
  training ends instead of letting it evaluate the final step."""
  process = _start(state_dir, "--num_workers=2", "--num_evaluators=1",
                   task_flags=["--task=evaluator-0=until_go"])
  try:
    process.wait_for(r"\[launch\] the job exited with 0", timeout=20)
    time.sleep(0.5)
    assert process.process.poll() is None, process.output  # still waiting for the evaluator
    (state_dir / "go").touch()
    assert process.wait(timeout=20) == 0, process.output
  finally:
    process.kill()
  cluster = _recorded(state_dir, "evaluator-0")["tf_config"]["cluster"]
  _assert_loopback_cluster(cluster, {"worker": 2, "evaluator": 1})
  assert _recorded(state_dir, "evaluator-0")["tf_config"]["task"] == {"type": "evaluator",
                                                                      "index": 0}
  for i in range(2):
    assert _recorded(state_dir, f"worker-{i}")["tf_config"] == {
        "cluster": cluster, "task": {"type": "worker", "index": i}}
  assert "[launch] evaluator-0 evaluated the final step (exit 0)" in process.output
  assert _launched(process.output) == {"evaluator-0": 1, "worker-0": 1, "worker-1": 1}


def test_a_failed_evaluator_leaves_training_and_group_restarts_alone(state_dir):
  """Catches: an evaluator failure that kills or fails training, one that goes unreported,
  and an evaluator restarted (re-evaluating every step) with each group restart."""
  result = _launch(state_dir, "--num_workers=2", "--num_evaluators=1",
                   task_flags=["--then=exit:0", "--task=worker-1=crash_once",
                               "--task=evaluator-0=exit:1"])
  assert result.returncode == 0, result.stderr
  assert "[launch] evaluator-0 exited with 1; training goes on without it" in result.stderr
  assert ("[launch] the evaluator failed: evaluator-0 exited with 1; the job's exit code is "
          "training's (0)") in result.stderr
  assert _launched(result.stderr) == {"evaluator-0": 1, "worker-0": 2, "worker-1": 2}


def test_failed_training_stops_the_evaluator_with_its_exit_code(state_dir):
  """Catches: a launcher that waits forever for an evaluator whose final step will never
  come, or that reports the evaluator's exit code instead of training's."""
  result = _launch(state_dir, "--num_workers=2", "--num_evaluators=1",
                   task_flags=["--then=until_signal", "--task=worker-1=exit:2",
                               "--task=evaluator-0=until_signal"])
  assert result.returncode == 2, result.stderr
  if "[evaluator-0] task evaluator 0" in result.stdout:  # on a loaded machine it may still
    # be starting when worker-1 exits: then SIGTERM ends it before its handler exists
    assert "[evaluator-0] evaluator-0 stopping on SIGTERM" in result.stdout
  assert "the evaluator failed" not in result.stderr


def test_a_signal_reaches_the_evaluator_too(state_dir):
  process = _start(state_dir, "--num_workers=1", "--num_evaluators=1",
                   task_flags=["--then=until_signal"])
  try:
    _wait_ready(process, {"worker-0", "evaluator-0"})
    process.send(signal.SIGTERM)
    assert process.wait(timeout=20) == 42, process.output
  finally:
    process.kill()
  assert sorted(_signals(state_dir)) == ["evaluator-0 SIGTERM", "worker-0 SIGTERM"]
  assert "the evaluator failed" not in process.output


@pytest.mark.parametrize("launcher_flags", [
    ["--num_workers=2", "--num_evaluators=2"], ["--num_workers=2", "--num_evaluators=-1"],
])
def test_bad_num_evaluators_exits_2_with_one_line(state_dir, launcher_flags):
  """TF allows at most one evaluator (multi_worker_util)."""
  result = _launch(state_dir, *launcher_flags)
  assert result.returncode == 2
  lines = result.stderr.splitlines()
  assert len(lines) == 1 and lines[0].startswith("distloop.launch: error: "), result.stderr
  assert not _starts(state_dir)


# -- which task the launcher blames for a group failure -----------------------------


class _Ended:
  """A task's process as the launcher polls it once it has ended."""

  def __init__(self, pid: int, code: int):
    self.pid, self.returncode = pid, code

  def poll(self):
    return self.returncode

  def send_signal(self, signum):
    del signum

  def wait(self, timeout=None):
    del timeout
    return self.returncode


def _ended_task(index: int, code: int, *, ended_at: float, lost_peer=False, last_step=None):
  from trainer.cluster import launch_tasks  # pylint: disable=g-import-not-at-top
  task = launch_tasks.Task("worker", index, "", _Ended(100 + index, code))
  task.output_closed = [ended_at, ended_at]  # stdout and stderr closed: it exited then
  task.lost_peer, task.last_step = lost_peer, last_step
  return task


@pytest.mark.parametrize("worker_0, worker_1, blamed", [
    # worker-1 SIGKILLed; worker-0's collective failed on it, in the same poll.
    (dict(code=1, ended_at=1.0, lost_peer=True, last_step=30),
     dict(code=-9, ended_at=2.0, last_step=30),
     "worker-1 (pid 101) was killed by SIGKILL after logging step 30"),
    # The same, before worker-0's last line was read: death by a signal is the cause.
    (dict(code=1, ended_at=1.0), dict(code=-9, ended_at=2.0),
     "worker-1 (pid 101) was killed by SIGKILL"),
    # Both exited 1: the one that says it lost a peer is not the cause.
    (dict(code=1, ended_at=1.0, lost_peer=True), dict(code=1, ended_at=2.0, last_step=5),
     "worker-1 (pid 101) exited with 1 after logging step 5"),
    # Both exited 1, neither said why: the first to exit.
    (dict(code=1, ended_at=2.0), dict(code=1, ended_at=1.0),
     "worker-1 (pid 101) exited with 1"),
    # worker-0 was killed: blamed, whatever the task order.
    (dict(code=-9, ended_at=2.0), dict(code=1, ended_at=1.0, lost_peer=True),
     "worker-0 (pid 100) was killed by SIGKILL"),
], ids=["killed-and-survivor-lost-peer", "killed-and-survivor-unread", "lost-peer-is-no-cause",
        "first-to-exit", "worker-0-killed"])
def test_a_group_failure_blames_the_first_task_to_fail(worker_0, worker_1, blamed):
  """Catches: `worker-0 exited with 1` when worker-1 was SIGKILLed and worker-0's
  collective then failed on it (both seen in one poll, the first in task order blamed)."""
  from trainer.cluster import launch  # pylint: disable=g-import-not-at-top
  launcher = launch.Launcher("trainer", [], num_workers=2, num_ps=0, max_restarts=1)
  launcher.tasks = [_ended_task(0, **worker_0), _ended_task(1, **worker_1)]
  with pytest.raises(launch.GroupFailed) as failure:
    launcher._check_synchronous()  # pylint: disable=protected-access
  assert str(failure.value) == blamed


def test_the_relay_notes_the_last_step_and_a_lost_peer():
  """What the launcher's line about a failure says comes from the task's own output."""
  import io  # pylint: disable=g-import-not-at-top
  from trainer.cluster import launch_tasks  # pylint: disable=g-import-not-at-top
  task = launch_tasks.Task("worker", 0, "")
  pipe = io.BytesIO(b"I1128 06:16:12.7 progress.py:89] step 30/60 | epoch 1.44 | loss 1.9\n"
                    b"I1128 06:16:12.8 controller.py:499] checkpoint at step 40 started\n"
                    b"distloop: error: lost a peer worker at step 30 (UnavailableError: "
                    b"Collective ops is aborted by: Socket closed): ...\n")
  stream = io.StringIO()
  launch_tasks.relay(pipe, stream, task)
  assert task.last_step == 30 and task.lost_peer and len(task.output_closed) == 1
  assert stream.getvalue().splitlines()[0].startswith("[worker-0] I1128")
