"""The same job under each way to scale, side by side: `python -m benchmarks.strategies`.

Runs the distloop CLI (through `trainer.launch` for the multi-process
strategies) on the synthetic data with one config, and prints a table of
steady-state examples/s (summary.json's `examples_per_sec`: the first, tracing
loop left out), final eval accuracy and wall time per strategy, with the
machine's core count. Every run is a fresh model_dir in a temporary folder.

On a machine with few cores, more processes share the same cores: the table
shows the cost of the machinery (collectives, RPCs to parameter servers), not a
speed-up. On a real cluster each worker brings its own cores.
"""
import json
import os
import subprocess
import sys
import tempfile
import time

from absl import app
from absl import flags

_STEPS = flags.DEFINE_integer("steps", 600, "training steps of every run")
_BATCH = flags.DEFINE_integer("global_batch_size", 64, "global batch of every run")
_STEPS_PER_LOOP = flags.DEFINE_integer("steps_per_loop", 50, "steps per compiled loop")
_ONLY = flags.DEFINE_list("only", [], "run only these strategies (names as in the table)")

# name -> (launcher arguments or None for a single process, trainer flags)
_RUNS = {
    "default": (None, ["--config.runtime.strategy=default"]),
    "mirrored (2 CPU devices)": (None, ["--config.runtime.strategy=mirrored",
                                        "--config.runtime.num_cpu_devices=2"]),
    "multi_worker_mirrored (2 processes)": (["--num_workers=2"], []),
    "parameter_server (2 workers, 1 ps)": (["--num_workers=2", "--num_ps=1"], []),
}


def _command(launcher_args, model_dir: str, trainer_flags: list[str]) -> list[str]:
  common = ["--config=synthetic", f"--model_dir={model_dir}",
            f"--config.train.steps={_STEPS.value}",
            f"--config.train.global_batch_size={_BATCH.value}",
            f"--config.train.steps_per_loop={_STEPS_PER_LOOP.value}",
            f"--config.checkpoint.interval={_STEPS.value}", *trainer_flags]
  if launcher_args is None:
    return [sys.executable, "-m", "trainer", *common]
  return [sys.executable, "-m", "trainer.launch", *launcher_args, "--", *common]


def _run(name: str, root: str) -> dict:
  launcher_args, trainer_flags = _RUNS[name]
  model_dir = os.path.join(root, str(len(os.listdir(root))))
  start = time.perf_counter()
  completed = subprocess.run(_command(launcher_args, model_dir, trainer_flags),
                             capture_output=True, text=True, check=False)
  wall = time.perf_counter() - start
  if completed.returncode != 0:
    tail = "\n".join(completed.stderr.splitlines()[-15:])
    raise SystemExit(f"{name}: exit {completed.returncode}\n{tail}")
  with open(os.path.join(model_dir, "summary.json")) as f:
    summary = json.load(f)
  return {"examples_per_sec": summary["examples_per_sec"],
          "eval_accuracy": summary["eval_accuracy"], "wall_sec": wall,
          "replicas": summary["num_replicas"]}


def main(argv):
  del argv
  names = [name for name in _RUNS if not _ONLY.value or name.split()[0] in _ONLY.value]
  print(f"{_STEPS.value} steps of the seed CNN at global batch {_BATCH.value} on synthetic data; "
        f"{os.cpu_count()} CPU cores; {sys.platform}", flush=True)
  rows = []
  with tempfile.TemporaryDirectory(prefix="distloop_strategies_") as root:
    for name in names:
      rows.append((name, _run(name, root)))
      print(f"  done: {name}", file=sys.stderr, flush=True)
  print("\n| strategy | replicas | examples/s | vs default | eval accuracy | wall s |")
  print("| --- | ---: | ---: | ---: | ---: | ---: |")
  baseline = rows[0][1]["examples_per_sec"]
  for name, row in rows:
    print(f"| {name} | {row['replicas']} | {row['examples_per_sec']:.0f} | "
          f"{row['examples_per_sec'] / baseline:.2f}x | {row['eval_accuracy']:.4f} | "
          f"{row['wall_sec']:.1f} |")


if __name__ == "__main__":
  app.run(main)
