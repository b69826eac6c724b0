"""Two workers through `python -m trainer.launch` on converted records: they end with the
weights of two local replicas, and each reads only its own share of every batch (counted
with DISTLOOP_DEBUG_READS: every row a worker's pipeline reads is logged)."""
import numpy as np
import pytest

from input_pipelines import order
from input_pipelines import read_log
from tests.support.cli import train_ok
from tests.support.processes import TrainerProcess, assert_same_state, checkpoint_arrays, loopback_only
from tests.pipelines.test_records import _IMAGES_SPEC, write_records

pytestmark = pytest.mark.slow  # python -m pytest -m slow (CI runs these too)

_STEPS, _BATCH, _TRAIN, _EVAL = 60, 48, 12000, 500  # 60 steps and read-ahead: epoch 0
_FLAGS = ["--config=mnist_cnn", "--config.data.name=records", "--config.model.num_classes=10",
          f"--config.train.steps={_STEPS}",
          f"--config.train.global_batch_size={_BATCH}", "--config.train.steps_per_loop=5",
          "--config.checkpoint.interval=20", "--config.eval.global_batch_size=100",
          "--config.runtime.deterministic=true"]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  def columns(n, seed):
    rng = np.random.default_rng(seed)
    return {"images": rng.integers(0, 256, (n, 28, 28, 1), dtype=np.uint8),
            "labels": rng.integers(0, 10, n, dtype=np.int64)}
  return write_records(tmp_path_factory.mktemp("mw") / "records", columns(_TRAIN, 0),
                       columns(_EVAL, 1), shard_bytes=1 << 20, spec=_IMAGES_SPEC, label="labels")


@pytest.fixture(scope="module")
def two_workers(data_dir, tmp_path_factory):
  model_dir, reads = tmp_path_factory.mktemp("two_workers"), tmp_path_factory.mktemp("reads")
  job = TrainerProcess(None, "--num_workers=2", "--", f"--model_dir={model_dir}", *_FLAGS,
                       f"--config.data.dir={data_dir}", module="trainer.launch",
                       prefix=loopback_only(), env={"DISTLOOP_DEBUG_READS": str(reads)})
  try:
    assert job.wait() == 0, job.output[-3000:]
  finally:
    job.kill()
  return model_dir, read_log.load(str(reads))


def test_two_workers_reach_the_weights_of_two_local_replicas(data_dir, two_workers, tmp_path):
  train_ok(tmp_path, *_FLAGS, f"--config.data.dir={data_dir}",
           "--config.runtime.strategy=mirrored", "--config.runtime.num_cpu_devices=2")
  assert_same_state(checkpoint_arrays(two_workers[0], _STEPS), checkpoint_arrays(tmp_path, _STEPS),
                    atol=1e-5)


def _rows_of_replica(replica: int, steps: int) -> set:
  positions = (np.arange(steps)[:, None] * _BATCH + replica * _BATCH // 2
               + np.arange(_BATCH // 2)[None, :]).ravel()
  return set(order.rows(positions, 0, _TRAIN).numpy().tolist())


def test_each_worker_reads_only_its_share_of_every_batch(two_workers):
  _, reads = two_workers
  train = {w: reads["train", f"worker-{w}"] for w in (0, 1)}
  epoch = _TRAIN // _BATCH  # steps of epoch 0: a row belongs to one replica's share
  for worker in (0, 1):
    rows = train[worker]
    assert len(rows) == len(set(rows.tolist()))  # no row read twice
    assert _rows_of_replica(worker, _STEPS) <= set(rows.tolist())  # all it trained on ...
    assert set(rows.tolist()) <= _rows_of_replica(worker, epoch)  # ... and nothing of the other's
  assert not set(train[0].tolist()) & set(train[1].tolist())
  # Eval: every example once over both workers, half each.
  evaluated = {w: reads["eval", f"worker-{w}"].tolist() for w in (0, 1)}
  assert len(evaluated[0]) == len(evaluated[1]) == _EVAL // 2
  assert sorted(evaluated[0] + evaluated[1]) == list(range(_EVAL))
