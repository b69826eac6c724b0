"""Start-up: distloop's first training step vs a plain Keras script's, in alternating
fresh processes. `python -m benchmarks.startup --rounds=5`

Each round runs, in a random order, (a) benchmarks/plain_keras_first_step.py (import,
build the seed CNN, compile, one `fit` step) and (b) `python -m trainer --config=synthetic
--config.train.steps=1` (distloop's whole run: its checks, the data, the runtime, the
traced loop, one step, the eval, the checkpoint, the export). Measured from the parent,
from just before the process starts:

- first step: (a) when the script prints FIRST_STEP, (b) the time stamp of distloop's
  progress line for step 1 (absl's log prefix);
- exit: when the process has ended (the 1-step CLI's whole wall time).

Prints the medians, the ranges and the paired ratios distloop / plain Keras. Start-up
is mostly CPU-bound Python and TensorFlow's C++ start: keep the machine quiet.
"""
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time

from absl import app
from absl import flags

from benchmarks import throughput

_ROUNDS = flags.DEFINE_integer("rounds", 5, "alternating pairs of fresh processes")
_HERE = os.path.dirname(os.path.abspath(__file__))


def _plain_keras() -> tuple[float, float]:
  start = time.time()
  out = subprocess.run([sys.executable, os.path.join(_HERE, "plain_keras_first_step.py")],
                       capture_output=True, text=True, check=True).stdout
  end = time.time()
  first = float(re.search(r"FIRST_STEP (\S+)", out).group(1))
  return first - start, end - start


def _distloop() -> tuple[float, float]:
  with tempfile.TemporaryDirectory() as model_dir:
    start = time.time()
    err = subprocess.run([sys.executable, "-m", "trainer", "--config=synthetic",
                          "--config.train.steps=1", f"--model_dir={model_dir}/run"],
                         capture_output=True, text=True, check=True).stderr
    end = time.time()
  (_, first_step_done), = throughput.loop_boundaries(err, at_least=1)
  return first_step_done - start, end - start


def _line(label: str, values: list[float]) -> str:
  return (f"{label:34s} median {statistics.median(values):5.2f} s  "
          f"(range {min(values):.2f}-{max(values):.2f})")


def main(argv):
  del argv
  plain, ours = [], []
  for _ in range(_ROUNDS.value):
    pair = [("plain", _plain_keras), ("distloop", _distloop)]
    random.shuffle(pair)
    for name, run in pair:
      (plain if name == "plain" else ours).append(run())
  print(f"{_ROUNDS.value} rounds, load average now {os.getloadavg()[0]:.1f}")
  for index, what in ((0, "to the first step"), (1, "to exit")):
    print(_line(f"plain Keras, {what}", [p[index] for p in plain]))
    print(_line(f"distloop 1-step CLI, {what}", [o[index] for o in ours]))
    ratios = [o[index] / p[index] for p, o in zip(plain, ours)]
    print(f"{'  distloop / plain Keras':34s} median {statistics.median(ratios):5.2f}x  "
          f"(paired range {min(ratios):.2f}-{max(ratios):.2f})")


if __name__ == "__main__":
  app.run(main)
