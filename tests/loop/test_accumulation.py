"""train.accumulation_steps: k micro-batches per step, their gradients summed, reduced once.

With plain SGD (which moves the weights in proportion to the gradient: a gradient counted
k times, or a micro-batch's mean taken instead of its share of the global batch, fails by
far), 4 micro-batches of 16 end where one batch of 64 does, on 1 and 2 replicas. The seed
CNN has no dropout, so both draw nothing at random.
"""
import json
import subprocess
import sys

import pytest

from tests.support.cli import REPO, run_trainer, train_ok, user_environment
from tests.support.processes import assert_same_state, checkpoint_arrays

_COMMON = ["--config=synthetic", "--config.train.steps=20", "--config.train.global_batch_size=64",
           "--config.train.steps_per_loop=10", "--config.train.optimizer=sgd",
           "--config.train.learning_rate=0.02", "--config.data.num_train_examples=640",
           "--config.runtime.deterministic=true", "--config.runtime.strategy=mirrored"]


def _weights(tmp_path, accumulation: int, replicas: int) -> dict:
  model_dir = tmp_path / f"k{accumulation}_r{replicas}"
  summary = train_ok(model_dir, *_COMMON, f"--config.train.accumulation_steps={accumulation}",
                     f"--config.runtime.num_cpu_devices={replicas}")
  assert summary["step"] == 20 and summary["num_replicas"] == replicas
  return checkpoint_arrays(model_dir, 20)


@pytest.mark.slow
@pytest.mark.parametrize("replicas", [1, 2])
def test_four_micro_batches_of_16_equal_one_batch_of_64(tmp_path, replicas):
  whole = _weights(tmp_path, 1, replicas)
  accumulated = _weights(tmp_path, 4, replicas)
  model = [key for key in whole if key.startswith("model/")]
  assert len(model) == 6
  assert_same_state({key: accumulated[key] for key in model},
                    {key: whole[key] for key in model}, atol=1e-6)


_COUNT_REDUCTIONS = r'''
import json, sys
import tensorflow as tf
import trainer, configs
from tensorflow.python.distribute import distribute_lib

calls, loops = [], []
all_reduce = distribute_lib.ReplicaContext.all_reduce
def counting_all_reduce(self, *args, **kwargs):
  calls.append(tf.compat.v1.get_default_graph().name)  # the graph it is traced into
  return all_reduce(self, *args, **kwargs)
distribute_lib.ReplicaContext.all_reduce = counting_all_reduce
while_loop = tf.while_loop
def watching_while_loop(*args, name=None, **kwargs):
  loops.append(name)
  return while_loop(*args, name=name, **kwargs)
tf.while_loop = watching_while_loop

config = configs.get("synthetic")
config.unlock()
config.train.steps, config.train.steps_per_loop, config.train.accumulation_steps = 4, 2, 4
config.runtime.strategy, config.runtime.num_cpu_devices = "mirrored", 2
config.data.num_train_examples = 256
trainer.run(config, sys.argv[1])
print("RESULT " + json.dumps({"calls": calls, "loops": loops}))
'''


def test_one_reduction_per_step_outside_the_micro_batch_loop(tmp_path):
  """Every all_reduce the step makes, recorded with the graph it is traced into: one per
  replica in the step's trace, none inside the micro-batch loop's body (which runs k times). Catches:
  reducing each micro-batch's gradients (k all-reduces a step, same weights)."""
  completed = subprocess.run([sys.executable, "-c", _COUNT_REDUCTIONS, str(tmp_path / "run")],
                             capture_output=True, text=True, cwd=REPO, env=user_environment(),
                             timeout=600)
  assert completed.returncode == 0, completed.stderr[-3000:]
  line = next(text for text in completed.stdout.splitlines() if text.startswith("RESULT "))
  result = json.loads(line[len("RESULT "):])
  assert "accumulate_micro_batches" in result["loops"], result
  assert len(result["calls"]) == 2, result  # one per replica (2), in the step's one trace
  assert not any("accumulate_micro_batches" in graph for graph in result["calls"]), result


def test_a_batch_that_does_not_split_is_refused(tmp_path):
  result = run_trainer(tmp_path / "run", "--config=synthetic",
                       "--config.train.global_batch_size=64",
                       "--config.train.accumulation_steps=3")
  assert result.returncode == 2
  (line,) = result.error_lines()
  assert "not divisible into train.accumulation_steps=3 micro-batches" in line, line
