"""Sharded variables (runtime.variable_partitioner) on a parameter-server cluster, through
`python -m trainer.launch` on loopback: the recommender example trains on 2 ps + 2
workers with its tables split over both servers; its checkpoint, written with 2 ps,
restores onto 1 and onto 3 with identical values; SIGTERM -> 42 -> resume goes on.

A small table (1,000 users x 16) keeps each job under ~30 s on 2 cores."""
import json
import re
import shutil

import numpy as np
import pytest

from tests.support.processes import TrainerProcess, checkpoint_arrays, loopback_only, needs_loopback

pytestmark = pytest.mark.slow

_STEPS = 600
# fixed:3 = one shard per server, up to 3: 2 shards on 2 ps, 1 (unsplit) on 1, 3 on 3.
_FLAGS = ["--config=recommender", "--config.runtime.variable_partitioner=fixed:3",
          "--config.data.num_users=1000", "--config.data.num_items=100",
          "--config.data.num_train_examples=20000", "--config.data.num_eval_examples=2000",
          "--config.model.embedding_dim=16", f"--config.train.steps={_STEPS}",
          "--config.train.global_batch_size=128", "--config.train.learning_rate=40",
          "--config.checkpoint.interval=300"]
# Measured 0.80 at step 600 (chance: 0.5; asynchronous updates make it vary a little).
_TARGET_ACCURACY = 0.72
_USERS = "model/recommender/user_embedding/embeddings"
_HANG = 240


def _launch(model_dir, num_ps: int, *flags: str) -> TrainerProcess:
  return TrainerProcess(None, "--num_workers=2", f"--num_ps={num_ps}", "--",
                        f"--model_dir={model_dir}", *_FLAGS, *flags,
                        module="trainer.launch", prefix=loopback_only())


def _placement(output: str, key: str) -> list[str]:
  """The devices of `key`'s shards, from the chief's start-up line."""
  line = re.search(rf"sharded variable {re.escape(key)} \S+ \S+: (\d+) shards: (.*)", output)
  assert line, output[-3000:]
  return re.findall(r"rows on (\S+?)(?:,|$)", line.group(2))


@pytest.fixture(scope="module")
def two_ps(tmp_path_factory):
  """The recommender trained by 2 workers with its tables on 2 parameter servers."""
  model_dir = tmp_path_factory.mktemp("two_ps")
  job = _launch(model_dir, 2)
  assert job.finish(_HANG) == 0, job.output[-3000:]
  return model_dir, job.output


@needs_loopback
def test_two_ps_two_workers_train_the_recommender_with_its_tables_on_both_servers(two_ps):
  """Catches: the partitioner not reaching ParameterServerStrategy (no shards, or both on
  one server), training that does not learn through sharded tables (gradients of the
  shards not joined or not applied), a checkpoint holding shards instead of the table."""
  model_dir, output = two_ps
  for key in (_USERS, "model/recommender/item_embedding/embeddings"):
    devices = _placement(output, key.split("/", 1)[1])
    assert devices == ["/job:ps/replica:0/task:0/device:CPU:0",
                       "/job:ps/replica:0/task:1/device:CPU:0"], devices
  summary = json.loads((model_dir / "summary.json").read_text())
  assert summary["step"] == _STEPS and summary["strategy"] == "parameter_server"
  assert summary["eval_accuracy"] >= _TARGET_ACCURACY, summary
  arrays = checkpoint_arrays(model_dir, _STEPS)  # plain orbax: the whole table, one key
  assert arrays[_USERS].shape == (1000, 16)


@needs_loopback
@pytest.mark.parametrize("num_ps, shards", [(1, 0), (3, 3)])
def test_a_checkpoint_of_two_ps_restores_onto_another_number_with_identical_values(
    two_ps, tmp_path, num_ps, shards):
  """One more step at learning rate 0 on `num_ps` servers rewrites what was restored
  there as a new checkpoint. Catches: a checkpoint keyed or shaped by shard (refused or
  misassigned on another count), a restore that splits the table at the wrong rows."""
  model_dir = tmp_path / "model_dir"
  shutil.copytree(two_ps[0], model_dir)
  job = _launch(model_dir, num_ps, f"--config.train.steps={_STEPS + 1}",
                "--config.train.learning_rate=0")
  assert job.finish(_HANG) == 0, job.output[-3000:]
  assert f"Restored checkpoint at step {_STEPS}" in job.output
  if shards:
    assert len(set(_placement(job.output, _USERS.split("/", 1)[1]))) == shards
  else:  # one server: nothing to split
    assert "sharded variable" not in job.output
  before, after = checkpoint_arrays(two_ps[0], _STEPS), checkpoint_arrays(model_dir, _STEPS + 1)
  model_keys = [key for key in before if key.startswith("model/")]
  assert _USERS in model_keys
  for key in model_keys:
    np.testing.assert_array_equal(after[key], before[key], err_msg=key)


@needs_loopback
def test_sigterm_stops_with_42_and_a_resume_continues(tmp_path):
  """Catches: a sharded state that cannot be saved on a signal or restored by the next
  job (the whole job would start over or fail)."""
  job = _launch(tmp_path, 2)
  assert job.stop_at(r"\[chief-0\].* step 100/", timeout=_HANG) == 42, job.output[-3000:]
  stopped = re.search(r"\[chief-0\].*preempted at step (\d+)", job.output)
  assert stopped, job.output[-3000:]
  step = int(stopped.group(1))
  assert 0 < step < _STEPS

  resumed = _launch(tmp_path, 2)
  assert resumed.finish(_HANG) == 0, resumed.output[-3000:]
  assert f"Restored checkpoint at step {step}" in resumed.output
  summary = json.loads((tmp_path / "summary.json").read_text())
  assert summary["step"] == _STEPS


# The default example as docs/scaling-out.md runs it: 50,000 x 512 users (~100 MB), 1,000,000
# clicks, 1,500 steps of 2,048 at SGD rate 320. Measured 0.805, 0.814, 0.818 (chance 0.5;
# 0.50 before its tables started small; at rate 640: 0.75, 0.76 and once 0.63 with eval
# loss 6.2, overfit and diverging; 2026-11-25), ~63,000 examples/s, ~75 s on 2 cores.
_DEFAULT_TARGET_ACCURACY = 0.75


@needs_loopback
def test_the_default_example_trains_its_100_mb_table_to_its_target(tmp_path):
  """Catches: a default that does not learn at its own size (eval at chance), a table
  left whole on one server at 100 MB, a checkpoint of the wrong size."""
  job = TrainerProcess(None, "--num_workers=2", "--num_ps=2", "--", f"--model_dir={tmp_path}",
                       "--config=recommender", module="trainer.launch", prefix=loopback_only())
  assert job.finish(600) == 0, job.output[-3000:]
  line = re.search(r"sharded variable recommender/user_embedding/embeddings \(50000, 512\): "
                   r"2 shards: 25000 rows on \S+task:0\S*, 25000 rows on \S+task:1", job.output)
  assert line, job.output[-3000:]
  summary = json.loads((tmp_path / "summary.json").read_text())
  assert summary["step"] == 1500 and summary["eval_accuracy"] >= _DEFAULT_TARGET_ACCURACY, summary
  size = sum(path.stat().st_size for path in (tmp_path / "checkpoints" / "1500").rglob("*")
             if path.is_file())
  # Both whole tables (104.4 MB as float32; 96.7 MB measured, as orbax compresses), not
  # one server's shard of them (about half).
  assert 80e6 < size < 120e6, size
