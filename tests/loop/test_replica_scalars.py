"""A per-step scalar a Task's train_step returns must be the same on every replica (issue
43): one computed from the replica's share of the batch (a reduce_sum of its losses) was
averaged over the replicas, 72.06 on 1 replica and 36.03 on 2, without a word. Now the
loop compares the replicas' values when it ends and refuses a disagreement in one line;
a replica-invariant scalar (a learning rate, a counter, a value of the global batch) is
accepted, the same on 1 and 2 replicas. One process per replica count (two
MirroredStrategies of different device counts cannot share a process)."""
import os

import pytest
import tensorflow as tf

from tests.support.cli import REPO, run_trainer, train_ok
from trainer.loop import steps

_TASKS = os.path.join(REPO, "tests", "plugins", "task_plugins.py")


def _flags(task: str, replicas: int, *extra: str) -> list[str]:
  return ["--config=synthetic", f"--config.train.task={_TASKS}:{task}",
          f"--config.runtime.num_cpu_devices={replicas}", "--config.runtime.strategy=mirrored",
          "--config.runtime.deterministic=true", "--config.train.global_batch_size=32",
          "--config.train.optimizer=sgd", "--config.train.optimizer_args=",
          "--config.data.num_train_examples=128", "--config.data.num_eval_examples=32",
          "--config.train.steps=4", "--config.train.steps_per_loop=2", *extra]


def test_a_scalar_of_the_replicas_share_is_refused_in_one_line_naming_it(tmp_path):
  """Caught: `loss_sum` (reduce_sum of the replica's losses) and `loss_max` were reported
  as the mean over replicas, half the 1-replica sum on 2, and the run exited 0."""
  result = run_trainer(tmp_path / "run", *_flags("ScalarsOfTheReplicasShare", 2))
  assert result.returncode == 2, result.stderr[-3000:]
  assert "Traceback" not in result.stderr, result.stderr[-3000:]
  lines = [line for line in result.error_lines() if "distloop: error" in line]
  assert len(lines) == 1 and lines[0].startswith("distloop: error: "), result.stderr[-3000:]
  assert ("ScalarsOfTheReplicasShare.train_step returned per-step scalar(s) 'loss_sum', "
          "'loss_max' that differed between the 2 replicas in steps 1..2: a per-step scalar "
          "must be the same on every replica, not depend on the replica's share of the "
          "batch; return per-example values [batch]") in lines[0], lines[0]
  assert "step.all_gather" in lines[0]
  assert not (tmp_path / "run").exists()  # refused at the first loop: nothing kept


def test_replica_invariant_scalars_of_every_dtype_are_the_same_on_1_and_2_replicas(tmp_path):
  """A learning rate (float32, float16, bfloat16), an int64 counter variable, an int32 of
  the step, and values of the global batch (step.all_gather) pass the check, unchanged."""
  summaries = {replicas: train_ok(tmp_path / f"r{replicas}",
                                  *_flags("ReplicaInvariantScalars", replicas))
               for replicas in (1, 2)}
  one, two = summaries[1], summaries[2]
  assert two["num_replicas"] == 2
  for name in ("rate", "rate_float16", "rate_bfloat16"):
    assert two[f"train_{name}"] == pytest.approx(one[f"train_{name}"], rel=1e-6), name
  assert one["train_updates"] == two["train_updates"] == 3.5  # steps 3 and 4: mean of 3, 4
  assert one["train_steps_taken"] == two["train_steps_taken"] == 3.5
  assert two["train_global_loss_sum"] == pytest.approx(one["train_global_loss_sum"], rel=1e-5)
  assert two["train_global_loss_max"] == pytest.approx(one["train_global_loss_max"], rel=1e-2)


# -- the check itself, without a strategy ----------------------------------------------

def _replica_sums(sums, values_per_step):
  running = sums.zeros()
  for step, values in enumerate(values_per_step):
    running += sums.of_batch(values, tf.constant(4.0, tf.float64), step=tf.constant(step, tf.int64))
  return running


@pytest.mark.parametrize("first, second, differ", [
    ([30, 28], [30, 28], False),
    ([30, 28], [28, 30], True),  # the same sum over the loop, in other steps
    ([30, 28], [30, 29], True),
])
def test_integer_scalars_compare_exactly_step_by_step(first, second, differ):
  sums = steps.Sums(["correct"], checked=["correct"])
  gathered = tf.stack([_replica_sums(sums, [{"correct": tf.constant(v)} for v in first]),
                       _replica_sums(sums, [{"correct": tf.constant(v)} for v in second])])
  totals = sums.reduce_checked(gathered)
  assert sums.disagreeing(totals) == (["correct"] if differ else [])
  assert sums.result(totals)["examples"] == 16


@pytest.mark.parametrize("dtype, ulp", [(tf.float16, 2.0**-10), (tf.bfloat16, 2.0**-7),
                                        (tf.float32, 2.0**-23)])
def test_floats_an_ulp_apart_agree_and_a_few_tens_of_ulps_do_not(dtype, ulp):
  """A float reduced on each device may round apart by an ulp: accepted. A value of the
  replica's share differs by far more; 20 ulps of 1.5 is refused in every dtype."""
  sums = steps.Sums(["value"], checked=["value"])
  for other, differ in ((1.5 + ulp, False), (1.5 * (1 + 20 * ulp), True)):
    gathered = tf.stack([_replica_sums(sums, [{"value": tf.constant(1.5, dtype)}]),
                         _replica_sums(sums, [{"value": tf.constant(other, dtype)}])])
    assert sums.disagreeing(sums.reduce_checked(gathered)) == (["value"] if differ else [])


def test_a_non_finite_scalar_is_left_to_the_rollback():
  sums = steps.Sums(["value"], checked=["value"])
  gathered = tf.stack([_replica_sums(sums, [{"value": tf.constant(float("nan"))}]),
                       _replica_sums(sums, [{"value": tf.constant(1.0)}])])
  assert sums.disagreeing(sums.reduce_checked(gathered)) == []
