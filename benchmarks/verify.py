"""How long `python -m trainer.verify` takes on a job: `python -m benchmarks.verify
[--rounds=3] [--workers=0] [--config_flags=--config=synthetic]`

Runs the whole command (its own process, every trainer process it starts) `--rounds` times
on the given job (default: the seed CNN at its defaults, verify choosing --steps) and
prints each wall time, the median and the range, and the time of each run verify made
(its progress lines on stderr, time-stamped here). Goal on 2 CPU cores: under 3 minutes.
"""
import statistics
import subprocess
import sys
import tempfile
import time

from absl import app
from absl import flags

_ROUNDS = flags.DEFINE_integer("rounds", 3, "runs of the whole command")
_WORKERS = flags.DEFINE_integer("workers", 0, "verify's --workers (0: none)")
_CONFIG_FLAGS = flags.DEFINE_string("config_flags", "--config=synthetic",
                                    "the job's flags, space-separated")


def _once() -> tuple[float, list[tuple[float, str]]]:
  command = [sys.executable, "-m", "trainer.verify", *_CONFIG_FLAGS.value.split()]
  if _WORKERS.value:
    command.append(f"--workers={_WORKERS.value}")
  with tempfile.TemporaryDirectory() as scratch:
    start = time.time()
    process = subprocess.Popen([*command, f"--scratch={scratch}/runs"], text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    said = [(time.time() - start, line.strip()) for line in process.stderr
            if line.startswith("verify:")]
    output = process.stdout.read()
    code = process.wait()
    seconds = time.time() - start
  if code != 0:
    sys.exit(f"verify exited {code}:\n{output}\n" + "\n".join(line for _, line in said))
  return seconds, said


def main(argv):
  del argv
  times = []
  for round_ in range(_ROUNDS.value):
    seconds, said = _once()
    times.append(seconds)
    print(f"round {round_ + 1}: {seconds:.1f} s")
    for at, line in said:
      print(f"  {at:6.1f} s  {line}")
  print(f"verify {_CONFIG_FLAGS.value}{f' --workers={_WORKERS.value}' if _WORKERS.value else ''}: "
        f"median {statistics.median(times):.1f} s (range {min(times):.1f}-{max(times):.1f} s, "
        f"{len(times)} rounds)")


if __name__ == "__main__":
  app.run(main)
