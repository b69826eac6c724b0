"""Each mode builds only what it uses (issue 58): --mode=eval, predict, export and
continuous_eval of a trained model_dir build no training batches, and neither trace nor
compile the train step; --mode=train does all three (so the spies can see them).

Spies, not timings: each records a call where training's work begins (the training
batches from a position, the train step traced, the compiled train loop made)."""
import pytest

import configs
import trainer
from trainer.loop import batches as batches_module
from trainer.loop import steps
from trainer.supervised import task as supervised_task

_MODES = ("eval", "predict", "export", "continuous_eval")


def _config():
  config = configs.get("synthetic")
  config.unlock()
  config.model.conv_filters, config.model.dense_units = 4, 8
  config.train.steps, config.train.steps_per_loop = 2, 2
  config.train.global_batch_size = 16
  config.data.num_train_examples, config.data.num_eval_examples = 64, 32
  config.predict.chunk_rows = 32
  return config


@pytest.fixture
def spies(monkeypatch) -> list[str]:
  """What training's work recorded: one entry per call."""
  called = []

  def spy(owner, name, label):
    original = getattr(owner, name)

    def recorded(*args, **kwargs):
      called.append(label)
      return original(*args, **kwargs)
    monkeypatch.setattr(owner, name, recorded)

  spy(batches_module.TrainBatches, "from_position", "training batches")
  spy(supervised_task.SupervisedTask, "train_step", "train_step traced")
  spy(steps, "make_replica_step", "replica step made")
  spy(steps, "make_train_loop", "train loop compiled")
  return called


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> str:
  model_dir = str(tmp_path_factory.mktemp("modes") / "run")
  trainer.run(_config(), model_dir)
  return model_dir


def test_training_is_seen_by_the_spies(tmp_path, spies):
  """The spies can fail: a training run calls each of them."""
  trainer.run(_config(), str(tmp_path / "run"))
  assert {"training batches", "train_step traced", "replica step made",
          "train loop compiled"} <= set(spies)


@pytest.mark.parametrize("mode", _MODES)
def test_a_mode_that_does_not_train_builds_nothing_of_training(trained, mode, spies, tmp_path):
  """Caught on the code before (issue 58): every mode traced the train step and compiled
  the train loop (api.py built the whole Trainer for each)."""
  config = _config()
  if mode == "predict":
    config.predict.output = str(tmp_path / "predictions")
  result = trainer.run(config, trained, mode=mode)
  assert result is not None
  assert spies == [], f"--mode={mode} did training's work: {spies}"
