"""A TF_CONFIG cluster of trainers in one process tree, for shapes `trainer.launch` does
not make (a `chief` beside a `worker`, as a Kubeflow TFJob starts them) or with flags
that differ per task:

    python -m tests.support.cluster '[["chief", ["--flag", ...]], ["worker", []]]' -- <common flags>

Each task runs `python -m trainer <common flags> <its own flags>` with its TF_CONFIG on a
free 127.0.0.1 port. Output lines are prefixed with the task's name (`[chief-0] ...`),
after a `started chief-0 (pid N)` line, so a test can signal one task. The tasks die
with this process (even by SIGKILL). Exit code: the tasks' if they all agree, else 1.
Run it under `tests.support.processes.loopback_only()`: the tasks' gRPC servers listen on 0.0.0.0.
"""
import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import threading

_PR_SET_PDEATHSIG = 1
_lock = threading.Lock()


def _emit(line: str) -> None:
  with _lock:
    sys.stdout.write(line if line.endswith("\n") else line + "\n")
    sys.stdout.flush()


def _free_ports(count: int) -> list[int]:
  sockets = [socket.socket() for _ in range(count)]
  try:
    for s in sockets:
      s.bind(("127.0.0.1", 0))
    return [s.getsockname()[1] for s in sockets]
  finally:
    for s in sockets:
      s.close()


def _relay(process: subprocess.Popen, name: str) -> None:
  for line in process.stdout:
    _emit(f"[{name}] {line}")


def _die_with_parent() -> None:
  ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL))


def main(argv: list[str]) -> int:
  split = argv.index("--")
  tasks = json.loads(argv[1])
  common = argv[split + 1:]
  ports = iter(_free_ports(len(tasks)))
  cluster, names = {}, []
  for task_type, _ in tasks:
    names.append(f"{task_type}-{len(cluster.get(task_type, []))}")
    cluster.setdefault(task_type, []).append(f"127.0.0.1:{next(ports)}")
  processes, relays = [], []
  for name, (task_type, flags) in zip(names, tasks):
    index = int(name.rsplit("-", 1)[1])
    env = {**os.environ, "PYTHONUNBUFFERED": "1",
           "TF_CONFIG": json.dumps({"cluster": cluster,
                                    "task": {"type": task_type, "index": index}})}
    process = subprocess.Popen([sys.executable, "-m", "trainer", *common, *flags], env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               preexec_fn=_die_with_parent)
    _emit(f"started {name} (pid {process.pid})")
    relay = threading.Thread(target=_relay, args=(process, name))
    relay.start()
    processes.append(process)
    relays.append(relay)
  codes = [process.wait() for process in processes]
  for relay in relays:
    relay.join()
  _emit(f"exit codes {dict(zip(names, codes))}")
  return codes[0] if len(set(codes)) == 1 else 1


if __name__ == "__main__":
  sys.exit(main(sys.argv))
