"""Converted records on disk, measured: the converter, the pipeline vs training, the format.

    python -m benchmarks.records [--input=/usr/share/datasets/fashion-mnist] [--batch=256]

Prints a Markdown report of:
- converter throughput (records/s, zstd and uncompressed), from its own summary line;
- the file-backed pipeline alone (benchmarks/runners.py --runner=pipeline --data_dir, as
  the trainer consumes it) vs what training consumes (the trainer's steady-state
  examples/s on the same records), warm page cache; and the pipeline right after
  dropping the page cache (`echo 3 > /proc/sys/vm/drop_caches`, when this machine
  allows it: the report says whether it did);
- random reads of `--batch` records, array_record (as distloop reads it) vs the
  simplest alternative: one flat file plus an offsets array, read with os.pread.

Every measurement runs in a fresh process (benchmarks/runners.py says why), the
pipeline and training ones `--repeats` times (median). Timing is noisy on a
shared 2-core machine: the report gives the load average.
"""
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from absl import app
from absl import flags
import numpy as np

_INPUT = flags.DEFINE_string("input", "/usr/share/datasets/fashion-mnist",
                             "an MNIST-family folder (IDX files) to convert")
_BATCH = flags.DEFINE_integer("batch", 256, "global batch size")
_STEPS = flags.DEFINE_integer("steps", 400, "steps per timed run")
_REPEATS = flags.DEFINE_integer("repeats", 3, "fresh processes per measurement")
_WORK_DIR = flags.DEFINE_string("work_dir", "", "where to convert (default: a temp folder)")


def _run(*args: str, timeout: float = 1200) -> str:
  completed = subprocess.run([sys.executable, *args], capture_output=True, text=True,
                             timeout=timeout)
  if completed.returncode:
    raise RuntimeError(f"{' '.join(args[:3])} exited {completed.returncode}: "
                       f"{completed.stderr.strip().splitlines()[-1:]}")
  return completed.stdout


def _convert(output: str, compress: bool) -> float:
  shutil.rmtree(output, ignore_errors=True)
  stdout = _run("-m", "input_pipelines.convert", "--from=idx", f"--input={_INPUT.value}",
                f"--output={output}", "--shard_mb=8", f"--{'' if compress else 'no'}compress")
  return float(re.search(r"([\d.]+) records/s", stdout).group(1))


def _pipeline(data_dir: str, *extra: str) -> float:
  stdout = _run("-m", "benchmarks.runners", "--runner=pipeline", f"--batch={_BATCH.value}",
                f"--steps={_STEPS.value}", *([f"--data_dir={data_dir}"] if data_dir else []),
                *extra)
  return json.loads(stdout.split("RESULT ")[-1])["examples_per_sec"]


def _training(data_dir: str, model_dir: str) -> float:
  shutil.rmtree(model_dir, ignore_errors=True)
  _run("-m", "trainer", f"--model_dir={model_dir}", "--config=mnist_cnn",
       "--config.data.name=records", f"--config.data.dir={data_dir}",
       f"--config.train.global_batch_size={_BATCH.value}", f"--config.train.steps={_STEPS.value}",
       "--config.train.steps_per_loop=50", f"--config.checkpoint.interval={_STEPS.value}",
       f"--config.eval.interval={_STEPS.value}")
  with open(os.path.join(model_dir, "summary.json")) as f:
    return json.load(f)["examples_per_sec"]


def _drop_page_cache() -> str | None:
  """None if dropped; else why not."""
  try:
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
      f.write("3\n")
    return None
  except OSError as e:
    return f"{type(e).__name__}: {e.strerror}"


def _random_reads(data_dir: str, flat_dir: str) -> tuple[float, float]:
  """records/s of random batches: array_record (distloop's reader) vs flat file + pread."""
  from input_pipelines.records import manifest as manifest_lib  # pylint: disable=g-import-not-at-top
  from input_pipelines.records import shards  # pylint: disable=g-import-not-at-top
  manifest = manifest_lib.read(data_dir)
  shard = manifest.splits["train"][0]
  path = os.path.join(data_dir, shard["file"])
  readers = shards.Readers([path])
  count = shard["num_records"]
  records = readers.read(0, list(range(count)))
  flat = os.path.join(flat_dir, "flat.bin")
  offsets = np.concatenate([[0], np.cumsum([len(r) for r in records])])
  with open(flat, "wb") as f:
    for record in records:
      f.write(record)
  fd = os.open(flat, os.O_RDONLY)
  rng = np.random.default_rng(0)
  batches = [np.sort(rng.integers(0, count, _BATCH.value)).tolist() for _ in range(200)]

  def timed(read) -> float:
    read(batches[0])
    start = time.perf_counter()
    for batch in batches:
      read(batch)
    return len(batches) * _BATCH.value / (time.perf_counter() - start)
  array_record = timed(lambda rows: readers.read(0, rows))
  pread = timed(lambda rows: [os.pread(fd, int(offsets[i + 1] - offsets[i]), int(offsets[i]))
                              for i in rows])
  os.close(fd)
  return array_record, pread


def main(argv):
  del argv
  work = _WORK_DIR.value or tempfile.mkdtemp(prefix="distloop-bench-records-")
  zstd_dir, plain_dir = os.path.join(work, "zstd"), os.path.join(work, "uncompressed")
  lines = ["# Converted records, measured", "",
           f"Machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at start; "
           f"input {_INPUT.value}; batch {_BATCH.value}, 1 replica.", ""]
  rates = {"zstd": _convert(zstd_dir, True), "uncompressed": _convert(plain_dir, False)}
  lines += ["## Converter", "", "| shards | records/s |", "| --- | ---: |",
            *[f"| {name} | {rate:.0f} |" for name, rate in rates.items()], ""]

  training = [_training(zstd_dir, os.path.join(work, "run")) for _ in range(_REPEATS.value)]
  warm = [_pipeline(zstd_dir) for _ in range(_REPEATS.value)]
  in_memory = [_pipeline("") for _ in range(_REPEATS.value)]
  cold, why_not = [], None
  for _ in range(_REPEATS.value):
    why_not = _drop_page_cache()
    if why_not:
      break
    cold.append(_pipeline(zstd_dir, "--cold"))
  train_rate = statistics.median(training)
  lines += ["## Pipeline alone vs training (examples/s, median of "
            f"{_REPEATS.value} fresh processes)", "",
            "| what | examples/s | vs training |", "| --- | ---: | ---: |",
            f"| training (mnist_cnn, records on disk) | {train_rate:.0f} | 1.0x |",
            f"| records pipeline, warm page cache | {statistics.median(warm):.0f} | "
            f"{statistics.median(warm) / train_rate:.1f}x |"]
  if cold:
    lines.append(f"| records pipeline, page cache dropped first | {statistics.median(cold):.0f} "
                 f"| {statistics.median(cold) / train_rate:.1f}x |")
  lines += [f"| synthetic arrays in memory (for comparison) | {statistics.median(in_memory):.0f} "
            f"| {statistics.median(in_memory) / train_rate:.1f}x |", ""]
  if why_not:
    lines += [f"Cold cache: not measured, dropping the page cache was refused ({why_not}).", ""]
  array_record, pread = _random_reads(zstd_dir, work)
  lines += [f"## Random reads of {_BATCH.value} records (one shard, warm cache, one thread)", "",
            "| reader | records/s |", "| --- | ---: |",
            f"| array_record, group_size 1, zstd (distloop) | {array_record:.0f} |",
            f"| flat file + offsets, os.pread | {pread:.0f} |", ""]
  print("\n".join(lines))
  if not _WORK_DIR.value:
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
  app.run(main)
