"""`python -m trainer.launch --num_workers=N [--num_ps=M] [--num_evaluators=1] [--max_restarts=K]
    -- <trainer flags>`

Runs a multi-process job on this machine the way a cluster would: one process per
task, each `python -m trainer <trainer flags>` with its own TF_CONFIG, on free
127.0.0.1 ports, its output prefixed with the task's name (`[worker-1] ...`).

- `--num_ps=0` (default): N workers under MultiWorkerMirroredStrategy; worker 0 is the chief.
- `--num_ps=M`: ParameterServerStrategy: a chief (the coordinator, which trains), N workers
  and M parameter servers. All run the same command; a trainer whose TF_CONFIG says
  worker or ps serves until it is killed.
- `--num_evaluators=1`: an `evaluator` task besides (TF's convention: listed in every
  TF_CONFIG, outside the training cluster). Same command; it runs continuous_eval on the
  model_dir (trainer/api.py) and exits 0 once it has evaluated the final step. It is
  started once and never part of a group restart; it gets the forwarded signals. The
  job's exit code is training's: once training ends with 0 the launcher waits for the
  evaluator, otherwise it stops it; an evaluator that fails says so in one line and
  leaves training alone.

Who owns what: the launcher owns processes (ports, TF_CONFIG, logs, signals,
restarts); the trainer owns the state (checkpoints, resume, the preemption
protocol). So a restart is only the same command again, and the trainer resumes
from its latest checkpoint by itself. The launcher never imports TensorFlow.

Exit codes are the job's: 0 done, 2 bad input (never retried), 42 preempted
(SIGTERM/SIGINT/SIGHUP are forwarded to the trainers, which save and exit 42), 1 anything
else, including failures beyond --max_restarts restarts. Once a signal was
forwarded, trainers that end with 0, 42 or death by that very signal (one still
starting up) make the job 42 unless all of them finished (0): the latest complete
checkpoint is on disk and the same command resumes from it. A worker still running
60 s after another one ended (stuck in a collective on it) is killed, and one that fails
(its collective aborted) after another exited 42 leaves the job 42: the launcher ends
when its processes end.

When a worker dies or fails, the launcher says in one line which one caused it and how
(`worker-1 (pid N) was killed by SIGKILL after logging step 200; restarting the group
(restart 1 of 3) from the latest checkpoint`): the survivors' collectives fail on the one
gone, so several may end in the same poll; the cause is the one killed by a signal,
else the first to exit, never one that said it lost a peer (trainer/cluster/peers.py).
The survivors get _SURVIVOR_SEC to end by themselves (each says in one line that it
lost a peer) before the group is killed and restarted. A trainer flag
--preempted_exit_code=N (see trainer/errors.py) replaces 42 here too: the trainers
exit N when preempted, and so does the job.
"""
import json
import os
import signal
import subprocess
import sys
import threading
import time

from absl import app
from absl import flags

from trainer import errors  # no TensorFlow
from trainer.cluster import launch_tasks  # each process: ports, cores, its output, its end
from trainer.cluster.launch_tasks import Task, first_failure
from trainer.errors import EXIT_BAD_INPUT, EXIT_FAILURE, EXIT_OK, EXIT_PREEMPTED

_POLL_SEC = 0.1
_GRACE_SEC = 5.0  # servers get SIGTERM, then SIGKILL after this
# After a forwarded signal, once one worker ended, the others have this long to end too:
# one left may wait forever in a collective on the one gone (a user's Action that blocked
# on one worker: trainer/task/user_code.py); then it is killed and the job is preempted.
_STRAGGLER_SEC = 60.0  # longer than a preemption save: the chief may still be writing
# After a synchronous worker failed, the others have this long to end by themselves (their
# collective on it fails at once when its sockets close) before they are killed.
_SURVIVOR_SEC = 3.0

_NUM_WORKERS = flags.DEFINE_integer("num_workers", None, "worker processes (required)",
                                    lower_bound=1)
_NUM_PS = flags.DEFINE_integer("num_ps", 0, "parameter servers; 0 = synchronous training "
                               "(multi_worker_mirrored)", lower_bound=0)
_NUM_EVALUATORS = flags.DEFINE_integer(
    "num_evaluators", 0, "an evaluator task (0 or 1, as TF allows): continuous_eval of the "
    "model_dir beside training, until the final step", lower_bound=0, upper_bound=1)
_MAX_RESTARTS = flags.DEFINE_integer("max_restarts", 3, "restarts after failures before "
                                     "giving up with exit 1", lower_bound=0)
_TRAINER_MODULE = flags.DEFINE_string(
    "trainer_module", "trainer", "the module every process runs as `python -m MODULE "
    "<trainer flags>`: distloop's trainer, or your own entry point wrapping it (e.g. one that "
    "sets up logging or credentials first)")


def _log(message: str) -> None:
  launch_tasks.emit(sys.stderr, f"[launch] {message}")


class GroupFailed(Exception):
  """A failure that only a restart of every process fixes (the message says which task)."""


class Launcher:
  """Starts the group, watches it every 0.1 s, forwards signals, restarts after failures.

      while True:
        start every task on fresh ports
        watch: done -> return its exit code; failure -> stop all, restart (at most K times)
  """

  def __init__(self, module: str, trainer_flags: list[str], num_workers: int, num_ps: int,
               max_restarts: int, preempted: int = EXIT_PREEMPTED, num_evaluators: int = 0):
    self.command = [sys.executable, "-m", module, *trainer_flags]
    self.preempted = preempted  # the trainers' --preempted_exit_code: "run me again"
    self.num_workers, self.num_ps, self.max_restarts = num_workers, num_ps, max_restarts
    self.restarts = 0
    self.tasks: list[Task] = []  # the training cluster, restarted as a group
    # Outside the group: one port for the whole job, started once.
    self.evaluators = [Task("evaluator", i, f"127.0.0.1:{port}")
                       for i, port in enumerate(launch_tasks.free_ports(num_evaluators))]
    self._evaluator_failures: dict[str, str] = {}
    self._evaluators_stopped = False  # by the launcher, training having ended without 0
    self._cluster: dict[str, list[str]] = {}
    self._relays: list[threading.Thread] = []
    self._signals: list[int] = []  # received, not yet forwarded
    self._stopping = False  # a signal was forwarded: let the job end, restart nothing
    self._forwarded: set[int] = set()
    self._first_ended_at = None  # when a worker first ended after a forwarded signal

  def run(self) -> int:
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
      signal.signal(signum, lambda signum, frame: self._signals.append(signum))
    try:
      while True:
        self._start_group()
        try:
          code = self._watch()
        except GroupFailed as failure:
          if not self.num_ps:  # servers serve until killed: none would end by itself
            self._await_survivors()
          self._stop(signal.SIGKILL)  # survivors may hang in a collective on the dead peer
          if not self._may_restart(str(failure)):
            self._finish_evaluators(EXIT_FAILURE)
            return EXIT_FAILURE
          _log(f"{failure}; restarting the group (restart {self.restarts} of "
               f"{self.max_restarts}) from the latest checkpoint")
          continue
        # Parameter servers serve until told to stop; workers left after an exit 2 may
        # hang in a collective.
        self._stop(signal.SIGTERM if self.num_ps else signal.SIGKILL)
        _log(f"the job exited with {code}")
        self._finish_evaluators(code)
        return code
    finally:  # whatever happened, reap every child and print its last lines
      self._stop(signal.SIGKILL)
      self._stop(signal.SIGKILL, self.evaluators)
      for relay in self._relays:
        relay.join(timeout=2)

  def _start_group(self) -> None:
    if self.num_ps:
      counts = {"chief": 1, "worker": self.num_workers, "ps": self.num_ps}
    else:
      counts = {"worker": self.num_workers}
    # New ports: the old ones may linger.
    ports = iter(launch_tasks.free_ports(sum(counts.values())))
    self.tasks = [Task(kind, i, f"127.0.0.1:{next(ports)}")
                  for kind, count in counts.items() for i in range(count)]
    self._cluster = {kind: [t.address for t in self.tasks if t.type == kind] for kind in counts}
    if self.evaluators:  # every task's TF_CONFIG lists it, as a TFJob's does
      self._cluster["evaluator"] = [t.address for t in self.evaluators]
    for task in self.tasks:
      self._start(task)
    for task in self.evaluators:
      if task.process is None:  # the first group only: it outlives group restarts
        self._start(task)

  def _start(self, task: Task) -> None:
    """Same command, same TF_CONFIG each time: a restarted task rejoins on its old port."""
    tf_config = {"cluster": self._cluster, "task": {"type": task.type, "index": task.index}}
    env = {**os.environ, "TF_CONFIG": json.dumps(tf_config), "PYTHONUNBUFFERED": "1",
           **launch_tasks.core_share(len(self.tasks) + len(self.evaluators))}
    task.last_step, task.lost_peer, task.output_closed, task.relays = None, False, [], []
    # A session of its own: Ctrl-C in a terminal reaches the launcher only, which decides
    # who gets it (not the parameter servers, which would die under the coordinator).
    task.process = subprocess.Popen(self.command, env=env, cwd=os.getcwd(),
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    start_new_session=True,
                                    preexec_fn=launch_tasks.die_with(os.getpid()))
    _log(f"started {task.name} (pid {task.process.pid}) at {task.address}")
    for pipe, stream in ((task.process.stdout, sys.stdout), (task.process.stderr, sys.stderr)):
      relay = threading.Thread(target=launch_tasks.relay, args=(pipe, stream, task), daemon=True)
      relay.start()
      task.relays.append(relay)
      self._relays.append(relay)

  def _watch(self) -> int:
    """Returns the job's exit code, or raises GroupFailed."""
    while True:
      self._forward_signals()
      self._check_evaluators()
      code = self._check_parameter_server() if self.num_ps else self._check_synchronous()
      if code is not None:
        return code
      time.sleep(_POLL_SEC)

  def _check_synchronous(self) -> int | None:
    """MultiWorkerMirrored: the workers finish (0) or stop (42) together, or not at all."""
    codes = [task.process.poll() for task in self.tasks]
    if EXIT_BAD_INPUT in codes:
      return EXIT_BAD_INPUT  # bad input is the same on a retry
    failed = [task for task, code in zip(self.tasks, codes)
              if code not in (None, EXIT_OK, self.preempted) and not self._stopped_by_signal(code)]
    # A failure after a peer stopped (42) is its collective on that peer: the job is preempted.
    if failed and not (self._stopping and self.preempted in codes):
      self._read_to_the_end(failed)
      raise GroupFailed(first_failure(failed).ended())
    if None in codes:
      if self._stopping and any(code is not None for code in codes):
        now = time.monotonic()
        if self._first_ended_at is None:
          self._first_ended_at = now
        if now - self._first_ended_at >= _STRAGGLER_SEC:
          left = [t.name for t, code in zip(self.tasks, codes) if code is None]
          _log(f"{', '.join(left)} still running {_STRAGGLER_SEC:.0f} s after the others "
               f"stopped: killed (the latest complete checkpoint is where the job resumes)")
          self._stop(signal.SIGKILL)
          return self.preempted
      return None
    if self._stopping:  # asked to stop: anything short of all done is "run me again"
      return EXIT_OK if set(codes) == {EXIT_OK} else self.preempted
    if len(set(codes)) > 1:
      raise GroupFailed(f"the workers disagree: exit codes {codes}")
    return codes[0]

  def _read_to_the_end(self, tasks: list[Task]) -> None:
    """Waits (1 s at most) for the relays of tasks that exited to read their last lines:
    what first_failure weighs (a task's output closes as it exits)."""
    deadline = time.monotonic() + 1.0
    for relay in (relay for task in tasks for relay in task.relays):
      relay.join(timeout=max(deadline - time.monotonic(), 0))

  def _await_survivors(self) -> None:
    """After a worker failed, the others' collectives on it fail too: up to _SURVIVOR_SEC
    for them to end by themselves, each with its one line about the lost peer (one stuck
    in a collective, on a machine gone without closing its sockets, is killed after)."""
    deadline = time.monotonic() + _SURVIVOR_SEC
    while (any(task.process.poll() is None for task in self.tasks)
           and time.monotonic() < deadline):
      time.sleep(_POLL_SEC)

  def _stopped_by_signal(self, code: int) -> bool:
    """Died of a signal we forwarded (before its handler was installed): preempted."""
    return self._stopping and -code in self._forwarded

  def _check_parameter_server(self) -> int | None:
    """The chief decides; a lost worker is restarted alone, a lost ps restarts the group."""
    chief, servers = self.tasks[0], self.tasks[1:]
    code = chief.process.poll()
    if code in (EXIT_OK, EXIT_BAD_INPUT, self.preempted):
      return code
    if code is not None and self._stopped_by_signal(code):
      return self.preempted
    if code is not None:
      raise GroupFailed(chief.ended())
    if self._stopping:
      return None  # the coordinator is saving; servers are its business until it exits
    for task in servers:
      code = task.process.poll()
      if code == EXIT_BAD_INPUT:
        return code
      if code is None:
        continue
      failure = task.ended()
      if task.type == "ps":  # variables are lost: the chief must restore them
        raise GroupFailed(failure)
      if not self._may_restart(failure):
        return EXIT_FAILURE
      _log(f"{failure}; restarting it (restart {self.restarts} of {self.max_restarts})")
      self._start(task)  # the coordinator reschedules its work and reconnects
    return None

  def _check_evaluators(self) -> None:
    """An evaluator that failed is reported once; training goes on without it."""
    for task in self.evaluators:
      code = task.process.poll()
      if code in (None, EXIT_OK) or task.name in self._evaluator_failures:
        continue
      asked = self._stopping or self._evaluators_stopped
      if asked and (code == self.preempted or -code in (*self._forwarded, signal.SIGTERM,
                                                        signal.SIGKILL)):
        continue  # stopped as asked
      self._evaluator_failures[task.name] = launch_tasks.describe(code)
      _log(f"{task.name} {launch_tasks.describe(code)}; training goes on without it (the job's "
           f"exit code is training's)")

  def _finish_evaluators(self, code: int) -> None:
    """After training: waits for the evaluators to evaluate the final step (training
    ended with 0), else stops them; one line for each that failed."""
    if code == EXIT_OK and not self._stopping:
      while any(t.process.poll() is None for t in self.evaluators):
        self._forward_signals()
        time.sleep(_POLL_SEC)
    else:  # the final step will not come
      self._evaluators_stopped = True
      self._stop(signal.SIGTERM, self.evaluators)
    self._check_evaluators()
    for task in self.evaluators:
      failure = self._evaluator_failures.get(task.name)
      if failure:
        _log(f"the evaluator failed: {task.name} {failure}; the job's exit code is "
             f"training's ({code})")
      elif task.process.returncode == EXIT_OK:
        _log(f"{task.name} evaluated the final step (exit 0)")

  def _may_restart(self, failure: str) -> bool:
    """One budget for group and single-task restarts; none once the job was asked to stop."""
    if self._stopping or self._signals:
      _log(f"{failure}; not restarting: the job was asked to stop")
      return False
    if self.restarts >= self.max_restarts:
      _log(f"{failure}; giving up after {self.restarts} restarts "
           f"(--max_restarts={self.max_restarts})")
      return False
    self.restarts += 1
    return True

  def _forward_signals(self) -> None:
    """To the trainers only: workers, or the chief alone (servers would just die); and
    to the evaluators (they stop between evals, exit 42)."""
    trainers = (self.tasks[:1] if self.num_ps else self.tasks) + self.evaluators
    while self._signals:
      signum = self._signals.pop(0)
      self._stopping = True
      self._forwarded.add(signum)
      _log(f"{signal.Signals(signum).name}: forwarding it to "
           f"{', '.join(t.name for t in trainers)}; no restarts from now on")
      for task in trainers:
        task.process.send_signal(signum)  # a no-op for a process already reaped

  def _stop(self, signum: int, tasks: list[Task] | None = None) -> None:
    """Signals what still runs of `tasks` (the training group by default), SIGKILLs what
    outlives the grace period, reaps everything."""
    tasks = self.tasks if tasks is None else tasks
    alive = [t.process for t in tasks if t.process and t.process.poll() is None]
    for process in alive:
      process.send_signal(signum)
    deadline = time.monotonic() + (_GRACE_SEC if signum != signal.SIGKILL else 0)
    for process in alive:
      try:
        process.wait(timeout=max(deadline - time.monotonic(), 0.01))
      except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _strategy_flags(trainer_flags: list[str], num_ps: int) -> list[str]:
  """Appends the strategy the cluster implies; refuses flags that ask for another one."""
  wanted = "parameter_server" if num_ps else "multi_worker_mirrored"
  for i, arg in enumerate(trainer_flags):
    name, equals, value = arg.partition("=")
    if name.lstrip("-") != "config.runtime.strategy":
      continue
    if not equals:
      value = trainer_flags[i + 1] if i + 1 < len(trainer_flags) else ""
    if value != wanted:
      _fail(f"--num_ps={num_ps} runs {wanted}; the flags ask for {value or 'nothing'}")
    return list(trainer_flags)
  return [*trainer_flags, f"--config.runtime.strategy={wanted}"]


def main(argv: list[str]) -> int:
  trainer_flags = _strategy_flags(argv[1:], _NUM_PS.value)
  try:
    preempted = errors.check_preempted_exit_code(
        errors.preempted_exit_code_in(trainer_flags) or EXIT_PREEMPTED)
  except errors.UserError as e:
    _fail(e)
  launcher = Launcher(_TRAINER_MODULE.value, trainer_flags, _NUM_WORKERS.value, _NUM_PS.value,
                      _MAX_RESTARTS.value, preempted, _NUM_EVALUATORS.value)
  return launcher.run()


def _parse_flags(argv: list[str]) -> list[str]:
  """Launcher flags before `--`, the trainer's after it (passed through verbatim)."""
  split = argv.index("--") if "--" in argv else len(argv)
  try:
    rest = flags.FLAGS(argv[:split])
  except flags.Error as e:
    _fail(e)
  if len(rest) > 1:
    _fail(f"unexpected arguments: {' '.join(rest[1:])} (the trainer's flags go after --)")
  if _NUM_WORKERS.value is None:
    _fail("--num_workers is required")
  return [argv[0], *argv[split + 1:]]


def _fail(error) -> None:
  """One line on stderr, no traceback, exit 2."""
  message = " ".join(str(error).split())
  print(f"distloop.launch: error: {message}", file=sys.stderr)
  sys.exit(EXIT_BAD_INPUT)


def run() -> None:
  app.run(main, flags_parser=_parse_flags)

