"""distloop before vs after a change: `python -m benchmarks.paired --baseline=DIR`.

DIR is a checkout of the other commit (`git worktree add /tmp/before <commit>`). Each
measurement is a fresh `python -m trainer` process, run alternately in DIR and here
(A/B/A/B...), the same flags, the same steady-state window as benchmarks.throughput
(TensorBoard's loop-boundary timestamps: the first, tracing loop left out). Prints the
medians, the ranges and the paired ratios, so "within the run-to-run spread" is a
number. Keep the machine quiet while it runs.
"""
import os
import statistics
import sys

from absl import app
from absl import flags

from benchmarks import throughput

_BASELINE = flags.DEFINE_string("baseline", None, "a checkout of the commit to compare with",
                                required=True)
_WORKERS = flags.DEFINE_integer("workers", 1, "processes through `python -m trainer.launch` "
                                "(each with --replicas logical CPU devices); 1 = one process")
_TRAINER_FLAGS = flags.DEFINE_list("trainer_flags", [], "more trainer flags for every run, "
                                   "e.g. --config.runtime.deterministic=true")


def _in(directory: str, batch: int, replicas: int, steps: int) -> float:
  here = os.getcwd()
  os.chdir(directory)  # `python -m trainer` imports the checkout it runs in
  try:
    return throughput.distloop(batch, replicas, steps, workers=_WORKERS.value,
                                extra_flags=tuple(_TRAINER_FLAGS.value))["examples_per_sec"]  # pylint: disable=protected-access
  finally:
    os.chdir(here)


def main(argv):
  del argv
  baseline, current = os.path.abspath(_BASELINE.value), os.getcwd()
  print(f"distloop at {baseline} (before) vs {current} (after); "
        f"{throughput.REPEATS.value} alternating rounds", file=sys.stderr)
  print("| batch | replicas | before ex/s (range) | after ex/s (range) | after / before "
        "(paired range) |")
  print("|---|---|---|---|---|")
  for batch in map(int, throughput.BATCHES.value):
    for replicas in map(int, throughput.REPLICAS.value):
      steps = throughput.steps_of(batch)
      before, after = [], []
      for _ in range(throughput.REPEATS.value):
        before.append(_in(baseline, batch, replicas, steps))
        after.append(_in(current, batch, replicas, steps))
      ratios = [a / b for a, b in zip(after, before)]
      print(f"| {batch} | {replicas} | {statistics.median(before):.0f} ({min(before):.0f}-"
            f"{max(before):.0f}) | {statistics.median(after):.0f} ({min(after):.0f}-"
            f"{max(after):.0f}) | {statistics.median(after) / statistics.median(before):.2f}x "
            f"({min(ratios):.2f}-{max(ratios):.2f}) |", flush=True)


if __name__ == "__main__":
  app.run(main)
