"""One task of a local job (trainer/cluster/launch.py), as a process: what it is started
with (a free 127.0.0.1 port, its share of this machine's cores, death with the launcher),
its output relayed under its name (`[worker-1] ...`), and how it ended.

The launcher owns the group (start, watch, signals, restarts); this module owns what
each of its processes is, so the launcher's line about a failure (`worker-1 (pid N) was
killed by SIGKILL after logging step 200`) reads what the task's own output said. No
TensorFlow.
"""
import ctypes
import dataclasses
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

from trainer import errors  # no TensorFlow

_PIPES = 2  # stdout and stderr: a task's output ended when both closed (it exited)
# The progress line a trainer logs after each loop (trainer/loop/progress.py).
_STEP_LOGGED = re.compile(r"\] step (\d+)/\d+ \|")
_PR_SET_PDEATHSIG = 1
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None
_SIGNAL_NAMES = {s.value: s.name for s in signal.Signals}

_output_lock = threading.Lock()


def emit(stream, line: str) -> None:
  """Whole lines under one lock, so the output of N processes never interleaves mid-line."""
  with _output_lock:
    stream.write(line if line.endswith("\n") else line + "\n")
    stream.flush()


def relay(pipe, stream, task: "Task") -> None:
  """Copies a task's output, prefixed with its name; notes what the launcher's line about
  its failure uses: the last step it logged, whether it said it lost a peer, and when its
  output ended (both pipes close when it exits: the order of exits, finer than a poll)."""
  prefix = f"[{task.name}] "
  with pipe:
    for raw in iter(pipe.readline, b""):
      line = raw.decode(errors="replace")
      step = _STEP_LOGGED.search(line)
      if step:
        task.last_step = int(step.group(1))
      if errors.PEER_LOST in line:
        task.lost_peer = True
      emit(stream, prefix + line)
  task.output_closed.append(time.monotonic())


def describe(code: int) -> str:
  """"exited with 1", "was killed by SIGKILL"."""
  if code >= 0:
    return f"exited with {code}"
  return f"was killed by {_SIGNAL_NAMES.get(-code, f'signal {-code}')}"


def core_share(processes: int) -> dict:
  """Each process's share of this machine's cores (DISTLOOP_CORES, read by
  trainer/cluster/runtime.py): N processes that each ran every op on every core would
  oversubscribe them N times. Not where the user set TF_NUM_INTRAOP_THREADS (theirs
  decides); under runtime.deterministic the trainer's config decides instead, so that
  the sums do not depend on how many processes share the machine."""
  if os.environ.get("TF_NUM_INTRAOP_THREADS"):
    return {}
  cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
  return {"DISTLOOP_CORES": str(max(1, (cores or 1) // max(1, processes)))}


def free_ports(count: int) -> list[int]:
  """Holds all the sockets until every port is picked (no duplicates), then frees them."""
  sockets = []
  try:
    for _ in range(count):
      sockets.append(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
      sockets[-1].bind(("127.0.0.1", 0))
    return [s.getsockname()[1] for s in sockets]
  finally:
    for s in sockets:
      s.close()


def die_with(launcher_pid: int):
  """preexec_fn: the kernel SIGKILLs the child when the launcher dies, even by SIGKILL."""
  def preexec():
    if _LIBC is not None:
      _LIBC.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL))
    if os.getppid() != launcher_pid:  # the launcher died before prctl took effect
      os.kill(os.getpid(), signal.SIGKILL)
  return preexec


@dataclasses.dataclass
class Task:
  """One process of the job; `process` is replaced when the task is restarted."""
  type: str  # chief, worker, ps or evaluator
  index: int
  address: str
  process: subprocess.Popen | None = None
  # Of the current process, from its output (relay):
  last_step: int | None = None  # the last step it logged
  lost_peer: bool = False  # it said its collective failed on a peer that is gone
  output_closed: list[float] = dataclasses.field(default_factory=list)  # per pipe, when
  relays: list[threading.Thread] = dataclasses.field(default_factory=list)

  @property
  def name(self) -> str:
    return f"{self.type}-{self.index}"

  @property
  def ended_at(self) -> float:
    """When its output ended (it exited); infinity while it has not (yet) been read to
    the end."""
    return max(self.output_closed) if len(self.output_closed) >= _PIPES else float("inf")

  def ended(self) -> str:
    """One phrase: who and how, e.g. "worker-1 (pid 7) was killed by SIGKILL after logging
    step 200"."""
    step = f" after logging step {self.last_step}" if self.last_step is not None else ""
    return f"{self.name} (pid {self.process.pid}) {describe(self.process.returncode)}{step}"


def first_failure(failed: list[Task]) -> Task:
  """The task whose end made the others fail, among those that failed in one poll (0.1
  s): a worker killed or crashed makes its peers' collectives fail within milliseconds.
  Not one that said it lost a peer; one killed by a signal before one that exited
  (its peers' exit 1 follows from it); then the first to exit; then the task order."""
  return min(failed, key=lambda task: (task.lost_peer, task.process.returncode >= 0,
                                       task.ended_at))
