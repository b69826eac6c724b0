"""distloop vs Keras `fit` vs a bare loop, side by side: `python -m benchmarks.throughput`.

Every measurement runs in a fresh process (benchmarks/runners.py), alternating
distloop / fit / bare (A/B/C/A/B/C...) so that drifts of the machine hit all
three alike; the table reports the median of `--repeats`. Also measured: the
input pipeline alone, the cost of an async checkpoint every 100 steps, and the
peak RSS of each distloop run. Prints a markdown report (and writes it to
`--output`); docs/performance.md holds the one measured on the CI machine.
"""
import json
import os
import platform
import statistics
import subprocess
import sys

from absl import app
from absl import flags

_BATCHES = flags.DEFINE_list("batches", ["32", "256"], "global batch sizes")
_REPLICAS = flags.DEFINE_list("replicas", ["1", "2"], "replica counts (mirrored on CPUs)")
_REPEATS = flags.DEFINE_integer("repeats", 3, "fresh-process repeats of each measurement")
_STEPS = flags.DEFINE_integer("steps", 0, "timed steps (0: 2000 at batch 32, 500 at 256)")
_OUTPUT = flags.DEFINE_string("output", "", "also write the report here")
_QUICK = flags.DEFINE_bool("quick", False, "a smoke run: 1 repeat, few steps")


def _measure(runner: str, batch: int, replicas: int, steps: int, **extra) -> dict:
  command = [sys.executable, "-m", "benchmarks.runners", f"--runner={runner}",
             f"--batch={batch}", f"--replicas={replicas}", f"--steps={steps}",
             *[f"--{key}={value}" for key, value in extra.items()]]
  completed = subprocess.run(command, capture_output=True, text=True, check=False)
  lines = [line for line in completed.stdout.splitlines() if line.startswith("RESULT ")]
  if completed.returncode != 0 or not lines:
    raise SystemExit(f"{' '.join(command)}: exit {completed.returncode}\n"
                     + "\n".join(completed.stderr.splitlines()[-15:]))
  return json.loads(lines[-1][len("RESULT "):])


def _steps(batch: int) -> int:
  if _QUICK.value:
    return 200
  return _STEPS.value or (2000 if batch <= 32 else 500)


def _median(results: list[dict], key: str = "examples_per_sec") -> float:
  return statistics.median(r[key] for r in results)


def _machine() -> str:
  model = "unknown CPU"
  try:
    with open("/proc/cpuinfo") as f:
      model = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
  except (OSError, StopIteration):
    pass
  import keras  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  return (f"{model}, {os.cpu_count()} cores, Python {platform.python_version()}, "
          f"TensorFlow {tf.__version__}, Keras {keras.__version__}")


def main(argv):
  del argv
  repeats = 1 if _QUICK.value else _REPEATS.value
  lines = ["# Throughput", "", f"Machine: {_machine()}", "",
           f"Command: `python -m benchmarks.throughput {' '.join(sys.argv[1:])}`", "",
           f"Median of {repeats} fresh-process runs, alternating distloop / fit / bare.", ""]
  training = {}
  table = ["| batch | replicas | distloop ex/s | fit ex/s (best setting) | bare ex/s | "
           "distloop / fit | distloop / bare | distloop peak RSS MB |",
           "| ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: |"]
  for batch in map(int, _BATCHES.value):
    for replicas in map(int, _REPLICAS.value):
      runs = {"distloop": [], "fit": [], "bare": []}
      for _ in range(repeats):
        for runner in runs:
          runs[runner].append(_measure(runner, batch, replicas, _steps(batch)))
        print(f"  batch {batch}, {replicas} replica(s): {runs['distloop'][-1]['examples_per_sec']:.0f}"
              f" / {runs['fit'][-1]['examples_per_sec']:.0f} / "
              f"{runs['bare'][-1]['examples_per_sec']:.0f}", file=sys.stderr, flush=True)
      ours, fit, bare = (_median(runs[name]) for name in ("distloop", "fit", "bare"))
      training[batch, replicas] = ours
      table.append(f"| {batch} | {replicas} | {ours:.0f} | {fit:.0f} ({runs['fit'][-1]['setting']}) "
                   f"| {bare:.0f} | {ours / fit:.2f}x | {ours / bare:.2f}x | "
                   f"{_median(runs['distloop'], 'peak_rss_mb'):.0f} |")
  lines += ["## Training", "", *table, ""]

  pipeline = ["| batch | pipeline ex/s | fastest training ex/s at that batch | headroom |",
              "| ---: | ---: | ---: | ---: |"]
  for batch in map(int, _BATCHES.value):
    delivered = _median([_measure("pipeline", batch, 1, _steps(batch)) for _ in range(repeats)])
    consumed = max(rate for (b, _), rate in training.items() if b == batch)
    pipeline.append(f"| {batch} | {delivered:.0f} | {consumed:.0f} | {delivered / consumed:.1f}x |")
  lines += ["## Input pipeline alone", "", *pipeline, ""]

  batch, steps = int(_BATCHES.value[0]), _steps(int(_BATCHES.value[0]))
  with_saves, without = [], []
  for _ in range(repeats):
    with_saves.append(_measure("distloop", batch, 1, steps, checkpoint_interval=100))
    without.append(_measure("distloop", batch, 1, steps))
  cost = 1 - _median(with_saves) / _median(without)
  lines += ["## Async checkpoint every 100 steps", "",
            f"batch {batch}, 1 replica, {steps} steps: {_median(without):.0f} ex/s without, "
            f"{_median(with_saves):.0f} ex/s with a save every 100 steps: **{cost:.1%}** of "
            f"throughput (training blocked {_median(with_saves, 'checkpoint_time_sec'):.2f} s "
            f"in all for {steps // 100} saves).", ""]
  report = "\n".join(lines)
  print(report)
  if _OUTPUT.value:
    with open(_OUTPUT.value, "w") as f:
      f.write(report + "\n")


if __name__ == "__main__":
  app.run(main)
