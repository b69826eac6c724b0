"""Length bucketing (data.pad_to with data.bucket_window): examples of similar length
share a batch, so the small boundaries are used; every example once per epoch; the batch
sequence a pure function of (seed, position) for a resume and for any replica or worker
split; a resume that would regroup a window refused."""
import json
import os

import numpy as np
import pytest

from input_pipelines import batching, padding, sources
from tests.plugins import sequence_plugins
from tests.support.cli import REPO, train_ok
from tests.support.processes import assert_same_state, checkpoint_arrays
from trainer.errors import UserError
from trainer.state import config_changes
from trainer.store import model_dir as layout

_BATCH, _WINDOW = 32, 8
_EPOCH = 4 * _WINDOW * _BATCH  # four windows: 32 global batches


class _Config(dict):
  __getattr__ = dict.__getitem__


def _source(window=_WINDOW, pad_to="32,64,128", n=_EPOCH):
  """Sequences of length 5..200 whose label is their row, so a batch names its examples."""
  x, _ = sequence_plugins._sequences(n, np.random.default_rng(7))  # pylint: disable=protected-access
  pad = padding.from_config(_Config(pad_to=pad_to, pad_value=0.0, bucket_window=window))
  return sources.ArraySource(x, np.arange(n, dtype=np.int64), where="test", padding=pad)


def _batches(source, num, start_example=0, context=None):
  dataset = batching.train_dataset(source, seed=3, global_batch_size=_BATCH,
                                   start_example=start_example, input_context=context)
  return [(f.numpy(), y.numpy()) for f, y in dataset.take(num)]


def _padding_fraction(batches) -> float:
  """Padded tokens over real ones (tokens are >= 1, padding 0)."""
  return sum(f.size for f, _ in batches) / sum((f != 0).sum() for f, _ in batches)


def test_batches_group_similar_lengths_into_the_small_boundaries_each_example_once_per_epoch():
  epochs = _batches(_source(), 2 * _EPOCH // _BATCH)
  unbucketed = _batches(_source(window=0), 2 * _EPOCH // _BATCH)
  assert {f.shape[1] for f, _ in epochs} >= {32, 64, 128}
  # Measured 1.91 unbucketed, 1.16 bucketed (lengths uniform in 5..200).
  assert _padding_fraction(epochs) < 1.3 < 1.7 < _padding_fraction(unbucketed)
  for epoch in (epochs[:_EPOCH // _BATCH], epochs[_EPOCH // _BATCH:]):
    assert sorted(np.concatenate([y for _, y in epoch]).tolist()) == list(range(_EPOCH))
  # The order of the batches is shuffled, not short to long in each window.
  lengths = [f.shape[1] for f, _ in epochs[:_WINDOW]]
  assert lengths != sorted(lengths)


@pytest.mark.parametrize("start_step", [0, 3, 11])
def test_a_resume_at_any_step_sees_the_batches_of_the_uninterrupted_stream(start_step):
  """Steps 3 and 11 resume mid-window: the window is regrouped as it was, then skipped to."""
  source = _source()
  uninterrupted = _batches(source, 20)
  resumed = _batches(source, 20 - start_step, start_example=start_step * _BATCH)
  for (f, y), (g, z) in zip(uninterrupted[start_step:], resumed):
    np.testing.assert_array_equal(f, g)
    np.testing.assert_array_equal(y, z)
  assert min(f.shape[1] for f, _ in resumed) <= 64


class _Context:
  """A tf.distribute.InputContext stand-in: pipeline `id` of `pipelines`, `replicas` in all."""

  def __init__(self, pipelines, id_, replicas):
    self.num_input_pipelines, self.input_pipeline_id = pipelines, id_
    self.num_replicas_in_sync = replicas


@pytest.mark.parametrize("pipelines,replicas", [(1, 2), (2, 2), (2, 4)])
def test_every_worker_builds_its_share_of_the_same_bucketed_global_batches(pipelines, replicas):
  """Each pipeline groups the whole window itself; its replicas' shares, padded to the
  global batch's length, add up to the global batch of one replica."""
  source, steps, local = _source(), 10, replicas // pipelines
  full = _batches(source, steps)
  shares = [_batches(source, steps * local, context=_Context(pipelines, i, replicas))
            for i in range(pipelines)]
  for step, (features, labels) in enumerate(full):
    parts = [shares[i][step * local + d] for i in range(pipelines) for d in range(local)]
    np.testing.assert_array_equal(np.concatenate([f for f, _ in parts]), features)
    np.testing.assert_array_equal(np.concatenate([y for _, y in parts]), labels)


def test_grouped_batches_have_their_rows_when_traced():
  """Their rows came out of tf.numpy_function unknown: the step was traced for any batch,
  and under whole-step XLA its per-example values' run-time length check failed the
  first step (the guarantee matrix's GRU workload, runtime.jit_compile=true)."""
  features, labels = batching.train_dataset(_source(), seed=3, global_batch_size=_BATCH,
                                            start_example=0).element_spec
  assert features.shape.as_list() == [_BATCH, None] and labels.shape.as_list() == [_BATCH]


def test_fixed_length_data_reads_as_without_pad_to():
  """pad_to set on data whose examples all have one length: no grouping, the same stream."""
  x = np.random.default_rng(1).integers(1, 50, size=(256, 12)).astype(np.int32)
  y = np.arange(256, dtype=np.int64)
  pad = padding.from_config(_Config(pad_to="32,64", pad_value=0.0, bucket_window=_WINDOW))
  with_pad = _batches(sources.ArraySource(x, y, where="t", padding=pad), 12, start_example=64)
  without = _batches(sources.ArraySource(x, y, where="t"), 12, start_example=64)
  for (f, a), (g, b) in zip(with_pad, without):
    np.testing.assert_array_equal(f, g)
    np.testing.assert_array_equal(a, b)


# -- resume: what would regroup a half-used window is refused ----------------------------

def _checkpointed(tmp_path, config: dict) -> str:
  """A model_dir whose step 10 meta records `config` (as train_state writes it)."""
  model_dir = str(tmp_path / "run")
  meta_dir = os.path.join(layout.checkpoint_dir(model_dir), "10", "meta")
  os.makedirs(meta_dir)
  identity = {"fixed": config_changes.fixed_fields(config)}
  with open(os.path.join(meta_dir, "metadata"), "w") as f:
    json.dump({"step": 10, "examples_consumed": 320, "config": config, "identity": identity}, f)
  return model_dir


def _config(batch=32, window=16, pad_to="longest"):
  return {"data": {"pad_to": pad_to, "bucket_window": window},
          "train": {"global_batch_size": batch}}


def test_another_global_batch_size_is_refused_on_resume_with_bucketing(tmp_path):
  model_dir = _checkpointed(tmp_path, _config(batch=32))
  config_changes.check(model_dir, _config(batch=32))
  config_changes.check(model_dir, _config(batch=64, pad_to=""))  # fixed-length data: no groups
  with pytest.raises(UserError, match=r"train.global_batch_size=64, but .* was trained with "
                                      r"train.global_batch_size=32 and data.bucket_window=16"):
    config_changes.check(model_dir, _config(batch=64))


def test_a_run_from_before_bucketing_resumes_only_without_it(tmp_path):
  config = _config()
  del config["data"]["bucket_window"]
  model_dir = _checkpointed(tmp_path, config)
  with pytest.raises(UserError, match="set --config.data.bucket_window=0 to resume it"):
    config_changes.check(model_dir, _config())
  config_changes.check(model_dir, _config(window=0))


# -- end to end: 1 and 2 replicas train the same weights --------------------------------

_PLUGINS = os.path.join(REPO, "tests", "plugins", "sequence_plugins.py")
_FLAGS = ["--config=synthetic", f"--config.model.name={_PLUGINS}:masked_mean",
          f"--config.data.name={_PLUGINS}:numpy_sequences",
          "--config.data.num_train_examples=512", "--config.data.num_eval_examples=64",
          "--config.data.pad_to=32,64,128", "--config.data.bucket_window=4",
          "--config.train.global_batch_size=32", "--config.train.optimizer=sgd",
          "--config.train.learning_rate=0.1", "--config.train.steps=24",
          "--config.train.steps_per_loop=8", "--config.runtime.deterministic=true"]


@pytest.mark.slow
def test_one_and_two_replicas_train_the_same_weights_with_bucketing(tmp_path):
  train_ok(tmp_path / "one", *_FLAGS)
  train_ok(tmp_path / "two", *_FLAGS, "--config.runtime.strategy=mirrored",
           "--config.runtime.num_cpu_devices=2")
  assert_same_state(checkpoint_arrays(tmp_path / "two", 24),
                    checkpoint_arrays(tmp_path / "one", 24), atol=1e-6)
