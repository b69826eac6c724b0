"""Bigger than it is worth holding: a 2 GB converted dataset trains with the peak RSS of a
100 MB one (within 10%), and stopped mid-epoch by SIGTERM and resumed it ends with the
weights of the uninterrupted run. Records are incompressible random bytes (256 KiB each),
written uncompressed, so generating 2 GB takes seconds; the model reads a few bytes of each."""
import os
import shutil
import signal
import subprocess
import sys

import numpy as np
import pytest

from input_pipelines.records import convert
from input_pipelines.records import convert_inputs
from tests.support.cli import REPO
from tests.support.processes import assert_same_state, checkpoint_arrays

pytestmark = pytest.mark.slow  # python -m pytest -m slow (CI runs these too)

_RECORD_BYTES = 256 << 10
_SPEC = {"blob": {"encoding": "raw", "dtype": "uint8", "shape": [_RECORD_BYTES]},
         "label": {"encoding": "int64", "shape": []}}
_STEPS = 40
_FLAGS = ["--config=synthetic", "--config.data.name=records",
          f"--config.model.name={os.path.join(REPO, 'tests', 'plugins', 'record_plugins.py')}:blob_model",
          f"--config.train.steps={_STEPS}", "--config.train.global_batch_size=16",
          "--config.train.steps_per_loop=5", "--config.checkpoint.interval=20",
          "--config.eval.global_batch_size=32", "--config.runtime.deterministic=true"]


def _write(directory, num_train):
  def example(seed_offset):
    def make(i):
      rng = np.random.default_rng(seed_offset + i)
      return {"blob": np.frombuffer(rng.bytes(_RECORD_BYTES), np.uint8),
              "label": np.int64(rng.integers(10))}
    return make
  source = convert_inputs.from_examples(
      _SPEC, "label", {"train": (num_train, example(0)), "eval": (64, example(10**6))},
      fingerprint=f"random blobs {num_train}")
  convert.convert(source, str(directory), shard_bytes=256 << 20, compress=False,
                  show_progress=False)
  return directory


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
  root = tmp_path_factory.mktemp("scale")
  big = _write(root / "big", 8192)     # 2 GiB of training records
  small = _write(root / "small", 400)  # 100 MiB
  yield big, small
  shutil.rmtree(root, ignore_errors=True)


# Runs its arguments as a child and reports the child's peak RSS. A fresh, small process:
# a child forked straight from pytest (whose RSS is large) would report pytest's pages too.
_MEASURED = """
import os, signal, subprocess, sys

child = subprocess.Popen(sys.argv[1:])
signal.signal(signal.SIGTERM, lambda signum, frame: child.send_signal(signum))
_, status, usage = os.wait4(child.pid, 0)
print("MAXRSS_KB", usage.ru_maxrss, flush=True)
sys.exit(os.waitstatus_to_exitcode(status))
"""


def _train(model_dir, data_dir, *, stop_after_step=None):
  """(exit code, peak RSS in bytes, log) of one trainer process; SIGTERM once it logs the step."""
  process = subprocess.Popen([sys.executable, "-c", _MEASURED, sys.executable, "-m", "trainer",
                              f"--model_dir={model_dir}", *_FLAGS, f"--config.data.dir={data_dir}"],
                             cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  log = []
  for line in process.stderr:
    log.append(line)
    if stop_after_step is not None and f"step {stop_after_step}/" in line:
      process.send_signal(signal.SIGTERM)
  stdout = process.stdout.read()
  process.wait()
  peak_kb = int(stdout.split("MAXRSS_KB")[-1].split()[0])
  return process.returncode, peak_kb * 1024, "".join(log)


@pytest.fixture(scope="module")
def uninterrupted(datasets, tmp_path_factory):
  big, small = datasets
  runs = {}
  for name, data_dir in (("big", big), ("small", small)):
    model_dir = tmp_path_factory.mktemp(f"run_{name}")
    code, peak, log = _train(model_dir, data_dir)
    assert code == 0, log[-3000:]
    runs[name] = model_dir, peak
  return runs


def test_the_big_dataset_is_over_2_gb_and_the_small_one_about_100_mb(datasets):
  sizes = [sum(f.stat().st_size for f in d.glob("train-*")) for d in datasets]
  assert sizes[0] >= 2 << 30 and 90 << 20 <= sizes[1] <= 110 << 20


def test_peak_rss_does_not_grow_with_the_dataset(uninterrupted):
  big, small = uninterrupted["big"][1], uninterrupted["small"][1]
  print(f"peak RSS: 2 GiB dataset {big / 2**20:.1f} MiB, 100 MiB dataset {small / 2**20:.1f} MiB")
  assert abs(big - small) <= 0.10 * small


def test_sigterm_mid_epoch_then_resume_ends_with_the_uninterrupted_weights(
    datasets, uninterrupted, tmp_path):
  code, _, log = _train(tmp_path, datasets[0], stop_after_step=10)
  assert code == 42, log[-3000:]
  stopped = int(log.split("preempted at step ")[1].split(";")[0])
  assert 10 <= stopped < _STEPS  # mid-epoch: an epoch is 512 steps
  code, _, log = _train(tmp_path, datasets[0])
  assert code == 0 and f"Restored checkpoint at step {stopped}" in log, log[-3000:]
  assert_same_state(checkpoint_arrays(tmp_path, _STEPS),
                    checkpoint_arrays(uninterrupted["big"][0], _STEPS), atol=0)
