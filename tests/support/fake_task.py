"""A stand-in for `python -m trainer` under the launcher: no TensorFlow, starts in ms.

    python -m tests.support.fake_task --state_dir=DIR [--then=ACTION] [--task=NAME=ACTION ...]

It reads TF_CONFIG, records itself in DIR (`pids`: "name pid address" per start;
`NAME.json`: its TF_CONFIG, argv and DISTLOOP_CORES; `signals`: "name SIGNAL" per signal received), prints
`task worker 1 of cluster {...} ready` on stdout and a line on stderr, then acts.
The trainers (every worker without a chief; the chief with one) do `--then`; the
servers (worker and ps next to a chief) `serve`; `--task=worker-1=crash` overrides one task.
A chief first waits for every server of its cluster to start, as a coordinator would.

ACTION: `exit:N`; `crash` (SIGKILL itself); `crash_once` (crash on the first start, then
behave as if not named); `until_signal` (SIGTERM/SIGINT -> exit 42); `until_go` (exit 0
once DIR/go exists); `serve` (until a signal kills it); `starting` (dies of SIGTERM/SIGINT, as a
trainer does before its handler is installed). Other flags (the trainer's) are ignored.
"""
import argparse
import json
import os
import signal
import sys
import time


def _record(state_dir: str, filename: str, line: str) -> None:
  with open(os.path.join(state_dir, filename), "a") as f:
    f.write(line + "\n")


def _lines(path: str) -> list[str]:
  if not os.path.exists(path):
    return []
  with open(path) as f:
    return f.read().splitlines()


def main() -> int:
  parser = argparse.ArgumentParser(allow_abbrev=False)
  parser.add_argument("--state_dir", required=True)
  parser.add_argument("--then", default="exit:0")
  parser.add_argument("--task", action="append", default=[])
  args, _ = parser.parse_known_args()

  tf_config = json.loads(os.environ["TF_CONFIG"])
  kind, index = tf_config["task"]["type"], tf_config["task"]["index"]
  name = f"{kind}-{index}"
  is_server = "chief" in tf_config["cluster"] and kind in ("worker", "ps")
  default = "serve" if is_server else args.then
  action = dict(spec.split("=", 1) for spec in args.task).get(name, default)

  stop = []

  def on_signal(signum, frame):
    del frame
    _record(args.state_dir, "signals", f"{name} {signal.Signals(signum).name}")
    if action == "serve":  # die of it, as a real server does
      signal.signal(signum, signal.SIG_DFL)
      os.kill(os.getpid(), signum)
    stop.append(signum)

  for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
    signal.signal(signum, signal.SIG_DFL if action == "starting" else on_signal)

  pids = os.path.join(args.state_dir, "pids")
  starts = sum(line.split()[0] == name for line in _lines(pids))
  if action == "crash_once":
    action = "crash" if starts == 0 else default
  with open(os.path.join(args.state_dir, f"{name}.json"), "w") as f:
    json.dump({"tf_config": tf_config, "argv": sys.argv[1:],
               "cores": os.environ.get("DISTLOOP_CORES")}, f)
  address = tf_config["cluster"][kind][index]
  _record(args.state_dir, "pids", f"{name} {os.getpid()} {address}")
  if kind == "chief":  # like a coordinator, wait for every server of this cluster to be up
    servers = {a for k, addresses in tf_config["cluster"].items() for a in addresses if k != kind}
    while not servers <= {line.split()[2] for line in _lines(pids)}:
      time.sleep(0.01)

  print(f"task {kind} {index} of cluster {json.dumps(tf_config['cluster'])} ready", flush=True)
  print(f"{name} also writes to stderr", file=sys.stderr, flush=True)

  if action.startswith("exit:"):
    return int(action.split(":")[1])
  if action == "crash":
    os.kill(os.getpid(), signal.SIGKILL)
  while True:  # until_signal, until_go, serve, starting
    if action == "until_signal" and stop:
      print(f"{name} stopping on {signal.Signals(stop[0]).name}", flush=True)
      return 42
    if action == "until_go" and os.path.exists(os.path.join(args.state_dir, "go")):
      return 0
    time.sleep(0.02)


if __name__ == "__main__":
  sys.exit(main())
