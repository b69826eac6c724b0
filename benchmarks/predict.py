"""--mode=predict measured: rows/s against Keras `model.predict`, and memory against the input.

    python -m benchmarks.predict [--part=throughput,memory] [--repeats=3] [--rows=40000]

throughput: the synthetic CNN (configs/synthetic.py), trained a few steps; distloop's
  `--mode=predict` (Parquet and records written, chunks committed) against Keras
  `model.predict` on the same model (its builder, the same images in memory, nothing
  written), at batch 256 and 1024, on 1 replica and on 2 (MirroredStrategy over 2 logical
  CPU devices; Keras predicts under the strategy's scope). Whole processes, alternating
  runs; the rate is the marginal one, (rows_big - rows_small) / (seconds_big -
  seconds_small), of a process scoring the train split (--rows) and one scoring the eval
  split (--rows / 5), so start-up, tracing and the restore cancel out.
memory: converted records of 16 KB rows, a 2 GB split and a 200 MB one; the peak RSS
  (`ru_maxrss`, as the Peak RSS table of docs/performance.md) of `--mode=predict` scoring
  each: what does not grow with the input.

The speed of a model does not depend on its weights: Keras's model keeps its initial
weights (distloop's are the checkpoint's). Keep the machine quiet while it runs.
"""
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from absl import app
from absl import flags
import numpy as np

from benchmarks import throughput
from benchmarks.throughput import run_child

_PART = flags.DEFINE_list("part", ["throughput", "memory"], "what to measure")
# --repeats, --batches and --replicas are benchmarks/throughput.py's flags (defaults 3,
# [32, 256] and [1, 2]); this benchmark's batches default to 256 and 1024 (the issue's).
_REPEATS, _REPLICAS = throughput.REPEATS, throughput.REPLICAS
_ROWS = flags.DEFINE_integer("rows", 40000, "throughput: rows of the big split")
_PREDICT_BATCHES = flags.DEFINE_list("predict_batches", ["256", "1024"],
                                     "throughput: global batch sizes")
_MEMORY_GB = flags.DEFINE_float("memory_gb", 2.0, "memory: the big split's size")
_WORK_DIR = flags.DEFINE_string("work_dir", "", "where to write (default: a temp folder)")
# The child that runs Keras's predict.
_RUNNER = flags.DEFINE_enum("runner", "", ["", "keras"], "internal: run one Keras predict")
_BATCH = flags.DEFINE_integer("batch", 256, "internal: --runner's batch")
_RUNNER_REPLICAS = flags.DEFINE_integer("runner_replicas", 1, "internal: --runner's replicas")
_RUNNER_ROWS = flags.DEFINE_integer("runner_rows", 1000, "internal: --runner's rows")

_MODEL = ["--config=synthetic", "--config.runtime.deterministic=false"]
_ROW_FLOATS = 4096  # memory: 16 KB per row


def _trainer(*flags_: str) -> tuple[float, float, str]:
  """(wall seconds, peak RSS MB, stdout) of one `python -m trainer` process."""
  command = [sys.executable, "-m", "trainer", *flags_]
  start = time.perf_counter()
  stdout, stderr, code, rss = run_child(command, "onednn")
  seconds = time.perf_counter() - start
  if code:
    raise SystemExit(f"{' '.join(command)} exited {code}:\n{stderr[-3000:]}")
  return seconds, rss, stdout


def _replica_flags(replicas: int) -> list[str]:
  return ([] if replicas == 1 else ["--config.runtime.strategy=mirrored",
                                    f"--config.runtime.num_cpu_devices={replicas}"])


def _keras(batch: int, replicas: int, rows: int) -> float:
  """Wall seconds of a process that builds the CNN and runs model.predict on `rows`."""
  command = [sys.executable, "-m", "benchmarks.predict", "--runner=keras", f"--batch={batch}",
             f"--runner_replicas={replicas}", f"--runner_rows={rows}"]
  start = time.perf_counter()
  _, stderr, code, _ = run_child(command, "onednn")
  if code:
    raise SystemExit(f"{' '.join(command)} exited {code}:\n{stderr[-3000:]}")
  return time.perf_counter() - start


def keras_child() -> None:
  """One Keras predict: the synthetic config's model and images, in memory."""
  import configs  # pylint: disable=g-import-not-at-top
  from input_pipelines.datasets import synthetic  # pylint: disable=g-import-not-at-top
  import models  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  replicas = _RUNNER_REPLICAS.value
  if replicas > 1:
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * replicas)
  config = configs.get("synthetic")
  with config.unlocked():
    config.data.num_eval_examples = _RUNNER_ROWS.value
    config.model.num_classes = 10  # distloop takes it from the data
  images = (synthetic.build(config.data, 0).test_images.astype(np.float32) / 255.0)[..., None]
  strategy = (tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(replicas)])
              if replicas > 1 else tf.distribute.get_strategy())
  with strategy.scope():
    model = models.build(config.model, tf.TensorSpec([None, 28, 28, 1], tf.float32))
  outputs = model.predict(images, batch_size=_BATCH.value, verbose=0)
  print(json.dumps({"rows": len(outputs)}))


def throughput(work: str) -> list[str]:
  model_dir = os.path.join(work, "cnn")
  rows_big, rows_small = _ROWS.value, _ROWS.value // 5
  data = [f"--config.data.num_train_examples={rows_big}",
          f"--config.data.num_eval_examples={rows_small}"]
  _trainer(f"--model_dir={model_dir}", *_MODEL, *data, "--config.train.steps=20")
  results = {}
  for repeat in range(_REPEATS.value):
    for batch in map(int, _PREDICT_BATCHES.value):
      for replicas in map(int, _REPLICAS.value):
        for split, rows in (("train", rows_big), ("eval", rows_small)):
          output = os.path.join(work, f"out-{repeat}-{batch}-{replicas}-{split}")
          seconds, _, _ = _trainer(
              f"--model_dir={model_dir}", *_MODEL, *data, "--mode=predict",
              *_replica_flags(replicas), f"--config.predict.split={split}",
              f"--config.predict.global_batch_size={batch}", f"--config.predict.output={output}")
          shutil.rmtree(output)
          results.setdefault(("distloop", batch, replicas, rows), []).append(seconds)
          results.setdefault(("keras", batch, replicas, rows), []).append(
              _keras(batch, replicas, rows))
  lines = ["| batch | replicas | distloop rows/s | Keras predict rows/s | ratio |",
           "| ---: | ---: | ---: | ---: | ---: |"]
  for batch in map(int, _PREDICT_BATCHES.value):
    for replicas in map(int, _REPLICAS.value):
      rates = {}
      for runner in ("distloop", "keras"):
        big = statistics.median(results[(runner, batch, replicas, rows_big)])
        small = statistics.median(results[(runner, batch, replicas, rows_small)])
        rates[runner] = (rows_big - rows_small) / max(big - small, 1e-9)
      lines.append(f"| {batch} | {replicas} | {rates['distloop']:.0f} | {rates['keras']:.0f} | "
                   f"{rates['distloop'] / rates['keras']:.2f}x |")
  return lines


_WRITE_RECORDS = """
import sys
import numpy as np
from input_pipelines.records import convert, convert_inputs
directory, big, small, floats = sys.argv[1], *map(int, sys.argv[2:])
spec = {"features": {"encoding": "raw", "dtype": "float32", "shape": [floats]},
        "label": {"encoding": "int64", "shape": []}}
def split(count, salt):
  def example(i):
    rng = np.random.default_rng([salt, i])
    return {"features": rng.random(floats, dtype=np.float32), "label": i % 10}
  return count, example
source = convert_inputs.from_examples(spec, "label", {"train": split(big, 0), "eval": split(small, 1)},
                                      fingerprint="benchmarks.predict")
convert.convert(source, directory, shard_bytes=256 << 20, compress=False, show_progress=False)
"""


def memory(work: str) -> list[str]:
  big = int(_MEMORY_GB.value * (1 << 30) // (_ROW_FLOATS * 4))
  small = big // 10
  data_dir, model_dir = os.path.join(work, "records"), os.path.join(work, "mlp")
  # In a child: the converter's module defines flags of its own (--output) at import.
  subprocess.run([sys.executable, "-c", _WRITE_RECORDS, data_dir, str(big), str(small),
                  str(_ROW_FLOATS)], check=True)
  data = ["--config=synthetic", "--config.data.name=records", f"--config.data.dir={data_dir}",
          "--config.model.name=mlp", "--config.model.num_classes=10"]
  _trainer(f"--model_dir={model_dir}", *data, "--config.train.steps=2")
  lines = ["| split | rows | bytes | peak RSS (MB) | seconds |", "| --- | ---: | ---: | ---: | ---: |"]
  peaks = {}
  for split_name, rows in (("eval", small), ("train", big)):
    output = os.path.join(work, f"predicted-{split_name}")
    seconds, rss, _ = _trainer(f"--model_dir={model_dir}", *data, "--mode=predict",
                               f"--config.predict.split={split_name}",
                               "--config.predict.global_batch_size=256",
                               f"--config.predict.output={output}")
    shutil.rmtree(output)
    peaks[split_name] = rss
    lines.append(f"| {split_name} | {rows} | {rows * _ROW_FLOATS * 4 / (1 << 30):.2f} GB | "
                 f"{rss:.0f} | {seconds:.1f} |")
  lines.append(f"\nGrowth from 0.2 GB to {_MEMORY_GB.value:.1f} GB of input: "
               f"{peaks['train'] - peaks['eval']:+.0f} MB of peak RSS.")
  return lines


def main(argv):
  del argv
  if _RUNNER.value == "keras":
    keras_child()
    return
  work = _WORK_DIR.value or tempfile.mkdtemp(prefix="distloop-predict-bench-")
  report = [f"load average at start: {os.getloadavg()[0]:.2f}", ""]
  if "throughput" in _PART.value:
    report += ["## Rows/s, --mode=predict vs Keras model.predict", "", *throughput(work), ""]
  if "memory" in _PART.value:
    report += ["## Peak RSS against the input", "", *memory(work), ""]
  print("\n".join(report))
  if not _WORK_DIR.value:
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
  app.run(main)
