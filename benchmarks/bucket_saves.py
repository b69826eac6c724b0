"""A bucket model_dir's costs against local disk: one checkpoint save of the CNN, and the
wall time of a 1-step run (docs/performance.md, "A bucket model_dir").

    python -m benchmarks.bucket_saves [--repeats=5]

Run from the repository root with the `[test]` extra installed: it starts the test suite's
emulators (fake-gcs-server, moto's S3 server; tests/support/object_stores.py) on 127.0.0.1. An
emulator on the same machine measures distloop's own work per save (the staging write,
one request per file, the marker), not a network: add the store's latency per request
and the bandwidth of the upload for a real bucket.
"""
import os
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

from absl import app  # pylint: disable=wrong-import-position
from absl import flags  # pylint: disable=wrong-import-position

_REPEATS = flags.DEFINE_integer("repeats", 5, "measurements of each figure")
_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _cnn_state() -> tuple[dict, dict]:
  """The seed CNN's weights and Adam state as numpy trees (what a save writes: 4.2 MB)."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import configs  # pylint: disable=g-import-not-at-top
  import models  # pylint: disable=g-import-not-at-top
  config = configs.get("mnist_cnn")
  config.model.unlock()
  config.model.num_classes = 10
  model = models.build(config.model, tf.TensorSpec([None, 28, 28, 1], tf.float32))
  weights = {f"w{i}": np.asarray(v) for i, v in enumerate(model.weights)}
  optimizer = {f"m{i}": np.zeros_like(v) for i, v in weights.items()}
  optimizer.update({f"v{i}": np.zeros_like(v) for i, v in weights.items()})
  return weights, optimizer


def _save_seconds(model_dir: str, weights: dict, optimizer: dict, repeats: int) -> list[float]:
  """Seconds of each synchronous save (what the writer thread spends), step by step."""
  from trainer.state import checkpoints  # pylint: disable=g-import-not-at-top
  from trainer.store import mirror  # pylint: disable=g-import-not-at-top
  local = mirror.staged(model_dir)
  manager = checkpoints.Checkpoints(os.path.join(local, "checkpoints"), max_to_keep=3,
                                    async_save=False, writer=True)
  seconds = []
  for step in range(repeats + 1):
    start = time.perf_counter()
    manager.save(step, weights, optimizer, {"step": step})
    seconds.append(time.perf_counter() - start)
  manager.close()
  return seconds[1:]  # the first one builds orbax's handlers


def _one_step_run(model_dir: str, env: dict) -> float:
  start = time.perf_counter()
  subprocess.run([sys.executable, "-m", "trainer", "--config=mnist_cnn", "--model_dir",
                  model_dir, "--config.data.name=synthetic", "--config.train.steps=1",
                  "--config.eval.global_batch_size=500"], cwd=_REPO, env={**os.environ, **env},
                 check=True, capture_output=True)
  return time.perf_counter() - start


def main(argv):
  del argv
  sys.path.insert(0, _REPO)
  from tests.support.object_stores import Store  # pylint: disable=g-import-not-at-top
  weights, optimizer = _cnn_state()
  work = tempfile.mkdtemp(prefix="bucket_saves_")
  stores = {scheme: Store(scheme, os.path.join(work, scheme)) for scheme in ("gs", "s3")}
  try:
    rows = []
    for where in ("local", "gs", "s3"):
      if where == "local":
        model_dir, env = os.path.join(work, "local"), {}
      else:
        store = stores[where]
        os.environ.update(store.env)
        model_dir, env = store.new_url("saves"), store.env
      saves = _save_seconds(model_dir, weights, optimizer, _REPEATS.value)
      runs = [_one_step_run(model_dir.replace("saves", f"run{i}") if where != "local"
                            else os.path.join(work, f"run{i}"), env)
              for i in range(_REPEATS.value)]
      rows.append((where, statistics.median(saves), min(saves), max(saves),
                   statistics.median(runs), min(runs), max(runs)))
    print("| model_dir | one save of the CNN (4.2 MB), median [min, max] | a 1-step run, median "
          "[min, max] |\n| --- | --- | --- |")
    for where, save, save_low, save_high, run, run_low, run_high in rows:
      print(f"| {where} | {save * 1000:.0f} ms [{save_low * 1000:.0f}, {save_high * 1000:.0f}] "
            f"| {run:.1f} s [{run_low:.1f}, {run_high:.1f}] |")
  finally:
    for store in stores.values():
      store.close()


if __name__ == "__main__":
  app.run(main)
