"""Sparse gradients (IndexedSlices: the rows an Embedding looked up) are summed exactly on
every strategy: an Embedding model whose replicas get batches of other padded lengths
(data.pad_to=longest) reaches the weights of one replica with plain SGD on 2 and 3 local
replicas (mirrored; central_storage on 2), 2 workers (trainer.launch) and a
parameter-server cluster; a token repeated in a batch counts once in the gradient's norm
(grad_norm, train.clip_grad_norm).
"""
import keras
import numpy as np
import pytest
import tensorflow as tf

from tests.support.cli import train_ok
from tests.support.processes import (TrainerProcess, assert_same_state, checkpoint_arrays,
                             loopback_only, needs_loopback)
from trainer.task import contexts

_STEPS = 10
# masked_mean over sequences of 5..200 tokens, each replica's batch padded to its own
# longest (length grouping off, which would pad them alike): the replicas' Embedding
# gradients have different row counts.
_FLAGS = ["--config=synthetic", "--config.model.name=tests.plugins.sequence_plugins:masked_mean",
          "--config.data.name=tests.plugins.sequence_plugins:numpy_sequences",
          "--config.data.pad_to=longest", "--config.data.bucket_window=0",
          "--config.data.num_train_examples=240",
          "--config.data.num_eval_examples=48", "--config.train.global_batch_size=24",
          f"--config.train.steps={_STEPS}", "--config.train.steps_per_loop=5",
          "--config.train.optimizer=sgd", "--config.train.learning_rate=0.5",
          "--config.runtime.deterministic=true"]
# Binds on every step here (the gradient's norm is ~0.1..0.5).
_CLIPPED = "--config.train.clip_grad_norm=0.05"
_HANG = 300


def _replicas(n: int, strategy: str = "mirrored") -> list[str]:
  return [f"--config.runtime.strategy={strategy}", f"--config.runtime.num_cpu_devices={n}"]


def _trained(model_dir, *flags: str, steps: int = _STEPS) -> dict:
  train_ok(model_dir, *flags)
  return checkpoint_arrays(model_dir, steps)


def _launched(model_dir, *launcher_flags: str, trainer_flags, steps: int = _STEPS) -> dict:
  job = TrainerProcess(None, *launcher_flags, "--", f"--model_dir={model_dir}", *trainer_flags,
                       module="trainer.launch", prefix=loopback_only())
  try:
    assert job.wait(_HANG) == 0, job.output[-3000:]
  finally:
    job.kill()
  return checkpoint_arrays(model_dir, steps)


# -- in process: the norm of a gradient whose rows repeat -------------------------------

def test_a_row_looked_up_twice_counts_once_in_the_norm_and_the_update():
  """Caught: grad_norm (and clipping) took the norm of the IndexedSlices' values, 4.24
  here for a gradient whose one row is [6, 0] (norm 6)."""
  table = keras.Variable(np.zeros([5, 2], np.float32))
  optimizer = keras.optimizers.SGD(learning_rate=1.0)
  optimizer.build([table])
  step = contexts.StepContext(step=tf.constant(0, tf.int64), global_batch_size=2,
                              num_replicas=1, seed=0, loss_scales={})
  gradient = tf.IndexedSlices(tf.constant([[3.0, 0.0], [3.0, 0.0]]), tf.constant([1, 1]),
                              tf.constant([5, 2]))
  norm = step.apply_gradients(optimizer, [gradient], [table])
  assert float(norm) == pytest.approx(6.0)
  np.testing.assert_allclose(table.numpy()[1], [-6.0, 0.0])


# -- end to end: every strategy equals one replica ----------------------------------------

@pytest.fixture(scope="module")
def one_replica(tmp_path_factory):
  return _trained(tmp_path_factory.mktemp("one"), *_FLAGS)


@pytest.mark.slow
@pytest.mark.parametrize("strategy, replicas",
                         [("mirrored", 2), ("mirrored", 3), ("central_storage", 2)])
def test_local_replicas_at_other_padded_lengths_equal_one_replica(tmp_path, one_replica,
                                                                  strategy, replicas):
  """Catches the collective shape mismatch of unequal IndexedSlices (exit 1 before
  441a498, which densified them), and a reduction that loses or repeats rows."""
  assert_same_state(_trained(tmp_path, *_FLAGS, *_replicas(replicas, strategy)), one_replica,
                    atol=1e-6)


@pytest.mark.slow
def test_clipped_two_replicas_equal_one_replica(tmp_path):
  """Caught: one replica clipped by the norm of the looked-up rows (a repeated token
  counted as often as it repeats), two replicas by the dense gradient's: 4e-3 apart."""
  flags = [*_FLAGS, _CLIPPED]
  assert_same_state(_trained(tmp_path / "two", *flags, *_replicas(2)),
                    _trained(tmp_path / "one", *flags), atol=1e-6)


@pytest.mark.slow
@needs_loopback
def test_two_workers_at_other_padded_lengths_equal_one_replica(tmp_path, one_replica):
  assert_same_state(_launched(tmp_path, "--num_workers=2", trainer_flags=_FLAGS), one_replica,
                    atol=1e-6)


@pytest.mark.slow
@needs_loopback
def test_a_parameter_server_cluster_applies_sparse_gradients_as_one_replica(tmp_path):
  """One worker, so the updates are in order (two are asynchronous), and every step's
  batch is the whole training set, so its per-worker salted order changes only the
  order of the rows. Each step's padded length is the longest example."""
  flags = [flag for flag in _FLAGS if "num_train_examples" not in flag]
  flags += ["--config.data.num_train_examples=24", "--config.train.steps=4",
            "--config.train.steps_per_loop=2", _CLIPPED]
  expected = _trained(tmp_path / "one", *flags, steps=4)
  assert_same_state(_launched(tmp_path / "ps", "--num_workers=1", "--num_ps=1",
                              trainer_flags=flags, steps=4), expected, atol=1e-6)
