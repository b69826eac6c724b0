"""The same 2-worker job through `trainer.launch` and through Ray Train, side by side:
`python -m benchmarks.ray_vs_launch` (needs `pip install -e '.[ray]'`).

Both run the distloop CLI's job (synthetic data, multi_worker_mirrored, 2 worker
processes) in fresh model_dirs, alternating launcher and Ray run by run, and report per
run: the start time (command start to the chief's "Training ... from step 0" line: the
processes, TensorFlow, the cluster's collectives and the model built; for Ray also its
local cluster), steady-state examples/s (summary.json's `examples_per_sec`: the first,
tracing loop left out) and the wall time to exit. As root, with `unshare` and `ip`,
both run in a private network namespace with only loopback (their servers listen on
every address), as the tests do; elsewhere as they are.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time

from absl import app
from absl import flags

_STEPS = flags.DEFINE_integer("steps", 600, "training steps of every run")
_BATCH = flags.DEFINE_integer("global_batch_size", 64, "global batch of every run")
_STEPS_PER_LOOP = flags.DEFINE_integer("steps_per_loop", 50, "steps per compiled loop")
_ROUNDS = flags.DEFINE_integer("rounds", 3, "runs of each, alternating")

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_STARTED = re.compile(r"Training .* from step 0 to")


def _prefix() -> list[str]:
  """A private network namespace with loopback only, where one can be made."""
  if os.geteuid() != 0 or not (shutil.which("unshare") and shutil.which("ip")):
    return []
  probe = subprocess.run(["unshare", "--net", "ip", "link", "set", "lo", "up"],
                         capture_output=True, check=False)
  if probe.returncode:
    return []
  return ["unshare", "--net", "sh", "-c", 'ip link set lo up && exec "$0" "$@"']


def _command(kind: str, model_dir: str) -> list[str]:
  common = ["--config=synthetic", f"--model_dir={model_dir}",
            f"--config.train.steps={_STEPS.value}",
            f"--config.train.global_batch_size={_BATCH.value}",
            f"--config.train.steps_per_loop={_STEPS_PER_LOOP.value}",
            f"--config.checkpoint.interval={_STEPS.value}"]
  if kind == "launch":
    return [sys.executable, "-m", "trainer.launch", "--num_workers=2", "--", *common]
  return [sys.executable, os.path.join(_REPO, "examples", "ray_train.py"), "--num_workers=2",
          *common]


def _run(kind: str, model_dir: str, prefix: list[str]) -> dict:
  env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
  env.pop("TF_CPP_MIN_LOG_LEVEL", None)
  start = time.perf_counter()
  process = subprocess.Popen([*prefix, *_command(kind, model_dir)], cwd=_REPO, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  started, lines = [], []

  def read():
    for line in process.stdout:
      lines.append(line)
      if not started and _STARTED.search(line):
        started.append(time.perf_counter() - start)
  reader = threading.Thread(target=read, daemon=True)
  reader.start()
  code = process.wait()
  wall = time.perf_counter() - start
  reader.join(timeout=10)
  if code != 0:
    raise SystemExit(f"{kind}: exit {code}\n{''.join(lines[-20:])}")
  with open(os.path.join(model_dir, "summary.json")) as f:
    summary = json.load(f)
  return {"start_sec": started[0] if started else float("nan"), "wall_sec": wall,
          "examples_per_sec": summary["examples_per_sec"], "replicas": summary["num_replicas"]}


def main(argv):
  del argv
  prefix = _prefix()
  print(f"2 workers, {_STEPS.value} steps of the seed CNN at global batch {_BATCH.value} on "
        f"synthetic data; {os.cpu_count()} CPU cores; "
        f"{'private network namespace' if prefix else 'host network'}", flush=True)
  rows = []
  with tempfile.TemporaryDirectory(prefix="distloop_ray_vs_launch_") as root:
    for round_ in range(_ROUNDS.value):
      order = ("launch", "ray") if round_ % 2 == 0 else ("ray", "launch")
      for kind in order:
        row = _run(kind, os.path.join(root, f"{kind}{round_}"), prefix)
        rows.append((kind, row))
        print(f"  {kind} run {round_ + 1}: start {row['start_sec']:.1f} s, "
              f"{row['examples_per_sec']:.0f} examples/s, wall {row['wall_sec']:.1f} s",
              file=sys.stderr, flush=True)
  print("\n| job | runs | start s (each) | examples/s (each) | wall s (each) |")
  print("| --- | ---: | --- | --- | --- |")
  for kind, name in (("launch", "trainer.launch --num_workers=2"),
                     ("ray", "examples/ray_train.py --num_workers=2")):
    mine = [row for k, row in rows if k == kind]
    def each(key, digits, mine=mine):
      return " / ".join(f"{row[key]:.{digits}f}" for row in mine)
    print(f"| {name} | {len(mine)} | {each('start_sec', 1)} | {each('examples_per_sec', 0)} | "
          f"{each('wall_sec', 1)} |")


if __name__ == "__main__":
  app.run(main)
