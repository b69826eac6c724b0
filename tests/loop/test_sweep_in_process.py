"""A sweep in one Python process (a notebook, Optuna, a Ray worker): trainer.run again and
again on runtime.strategy=mirrored over 2 logical CPU devices, each run with another model,
gives what a fresh process gives; what TensorFlow fixes for the process's life (the logical
CPU device count) is refused in one line, writing nothing.

The sweep runs in a child interpreter (the user's notebook): 2 logical devices need a
process whose TensorFlow has not started."""
import json
import os
import subprocess
import sys

import pytest

from tests.support.cli import REPO, train_ok, user_environment
from tests.support.processes import assert_same_state, loopback_only, needs_loopback, read_checkpoint

_FLAGS = {"train.steps": 4, "train.steps_per_loop": 2, "train.optimizer": "sgd",
          "train.learning_rate": 0.1, "data.num_train_examples": 256,
          "runtime.strategy": "mirrored", "runtime.num_cpu_devices": 2,
          "runtime.deterministic": True}
_RUNS = {  # model_dir name -> the fields it changes
    "dense_32": {"model.dense_units": 32},
    "dense_64": {"model.dense_units": 64},
    "mlp": {"model.name": "mlp", "model.dense_units": 48},
    "three_devices": {"runtime.num_cpu_devices": 3},
    # the pool the deterministic runs fixed (else cores / 2, refused on a bigger machine)
    "not_deterministic": {"runtime.deterministic": False, "runtime.intra_op_threads": 1},
}

# A notebook's cells: the synthetic config with "section.field" changes, in one process.
_PRELUDE = r'''
import json, sys
import configs, trainer
from trainer.errors import UserError

def configured(flags, changes):
  config = configs.get("synthetic")
  config.unlock()
  for field, value in {**flags, **changes}.items():
    section, key = field.split(".")
    setattr(config[section], key, value)
  return config
'''

_SWEEP = _PRELUDE + r'''
base, flags, runs = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
results = {}
for name, changes in runs.items():
  config = configured(flags, changes)
  try:
    results[name] = trainer.run(config, f"{base}/{name}")["step"]
  except UserError as e:
    results[name] = "UserError: " + str(e)
print("RESULTS " + json.dumps(results))
'''


def _cli_flags(changes: dict) -> list[str]:
  fields = {**_FLAGS, **changes}
  return ["--config=synthetic"] + [
      f"--config.{field}={str(value).lower() if isinstance(value, bool) else value}"
      for field, value in fields.items()]


@pytest.mark.slow
def test_a_sweep_in_one_process_equals_fresh_processes_and_refuses_what_tensorflow_fixes(
    tmp_path):
  completed = subprocess.run(
      [sys.executable, "-c", _SWEEP, str(tmp_path), json.dumps(_FLAGS), json.dumps(_RUNS)],
      capture_output=True, text=True, cwd=REPO, env=user_environment(), timeout=600)
  assert completed.returncode == 0, completed.stderr[-4000:]
  line = next(text for text in completed.stdout.splitlines() if text.startswith("RESULTS "))
  results = json.loads(line[len("RESULTS "):])

  # Each model after the first finishes (it died in a collective: "Shape mismatch in the
  # collective instance 100"), with the weights of the same config in a fresh process
  # (same checkpoint keys too: Keras's per-process layer names do not leak into them).
  assert results["dense_32"] == results["dense_64"] == results["mlp"] == 4, results
  for name in ("dense_64", "mlp"):
    train_ok(tmp_path / f"{name}_fresh", *_cli_flags(_RUNS[name]))
    assert_same_state(read_checkpoint(tmp_path / name, 4),
                      read_checkpoint(tmp_path / f"{name}_fresh", 4), atol=1e-6)

  # What TensorFlow fixes for the process: one line naming the fix, model_dir untouched.
  refused = results["three_devices"]
  assert refused.startswith("UserError: runtime.num_cpu_devices=3: ") and "\n" not in refused
  assert "runtime.num_cpu_devices=2" in refused and "subprocess" in refused, refused
  assert not os.path.exists(tmp_path / "three_devices")
  # Op determinism cannot be turned off: the run trains on deterministic kernels, and says so.
  assert results["not_deterministic"] == 4, results
  assert "which TensorFlow keeps on for the process" in completed.stderr


_REFUSALS = _PRELUDE + r'''
from trainer.cluster import runtime

base, flags = sys.argv[1], json.loads(sys.argv[2])
results = {}
def run(name, **changes):
  config = configured(flags, changes)
  try:
    trainer.run(config, f"{base}/{name}")
  except UserError as e:
    results[name] = str(e)
  return config

# Refused after the runtime started (2 devices): cheap, nothing trains.
config = run("odd_batch", **{"train.global_batch_size": 63})
results["same_strategy"] = (runtime.create_strategy(config.runtime)
                            is runtime.create_strategy(config.runtime))
run("three_devices", **{"runtime.num_cpu_devices": 3})
run("one_device", **{"runtime.num_cpu_devices": 1, "runtime.strategy": "default"})
print("RESULTS " + json.dumps(results))
'''


def test_what_tensorflow_fixes_for_the_process_is_refused_in_one_line(tmp_path):
  completed = subprocess.run(
      [sys.executable, "-c", _REFUSALS, str(tmp_path), json.dumps(_FLAGS)],
      capture_output=True, text=True, cwd=REPO, env=user_environment(), timeout=600)
  assert completed.returncode == 0, completed.stderr[-4000:]
  line = next(text for text in completed.stdout.splitlines() if text.startswith("RESULTS "))
  results = json.loads(line[len("RESULTS "):])
  assert "not divisible by the 2 replicas" in results["odd_batch"], results
  # One strategy per device set for the process: a second one's collective keys would
  # collide with the first's.
  assert results["same_strategy"] is True
  for name, field in (("three_devices", "runtime.num_cpu_devices=3"),
                      ("one_device", "runtime.num_cpu_devices=1")):
    assert results[name].startswith(f"{field}: "), results
    assert "subprocess" in results[name] and "\n" not in results[name], results[name]
    assert not os.path.exists(tmp_path / name)
  assert "keep runtime.num_cpu_devices=2" in results["three_devices"]


_WORKERS = r'''
import json, os, subprocess, sys
sweep, base, flags, runs = sys.argv[1:]
cluster = {"worker": ["127.0.0.1:23450", "127.0.0.1:23451"]}  # a private network namespace
workers = [subprocess.Popen(
    [sys.executable, "-c", sweep, base, flags, runs], stdout=subprocess.PIPE,
    text=True, env={**os.environ, "TF_CONFIG": json.dumps(
        {"cluster": cluster, "task": {"type": "worker", "index": i}})}) for i in range(2)]
print(json.dumps([w.communicate()[0] for w in workers] + [w.returncode for w in workers]))
'''


@pytest.mark.slow
@needs_loopback
def test_two_workers_of_one_cluster_sweep_models_in_their_processes(tmp_path):
  """A Ray worker's case: the same cluster (TF_CONFIG) in each process, trainer.run twice:
  the second model died in a collective (the second strategy's keys collided with the
  first's); now the strategy is kept, and two workers still equal two local replicas."""
  runs = {"dense_32": {"model.dense_units": 32}, "dense_64": {"model.dense_units": 64}}
  flags = {**_FLAGS, "runtime.strategy": "multi_worker_mirrored", "runtime.num_cpu_devices": 1}
  completed = subprocess.run(
      [*loopback_only(), sys.executable, "-c", _WORKERS, _SWEEP, str(tmp_path),
       json.dumps(flags), json.dumps(runs)],
      capture_output=True, text=True, cwd=REPO, env=user_environment(), timeout=600)
  assert completed.returncode == 0, completed.stderr[-4000:]
  *outputs, first, second = json.loads(completed.stdout.strip().splitlines()[-1])
  assert first == second == 0, completed.stderr[-4000:]
  for output in outputs:
    line = next(text for text in output.splitlines() if text.startswith("RESULTS "))
    assert json.loads(line[len("RESULTS "):]) == {"dense_32": 4, "dense_64": 4}, output
  train_ok(tmp_path / "local", *_cli_flags(runs["dense_64"]))  # 2 mirrored replicas
  assert_same_state(read_checkpoint(tmp_path / "dense_64", 4),
                    read_checkpoint(tmp_path / "local", 4), atol=1e-6)
