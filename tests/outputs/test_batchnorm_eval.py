"""BatchNorm models evaluate exactly when a replica's slice of the last eval batch is empty.

With eval batch 500 split over R replicas, replica r gets examples [r*ceil(500/R), ...): with
1, 7 or 100 eval examples every replica but the first gets none. oneDNN's Conv->BatchNorm
(distloop's CPU default) failed on an empty batch (`Incompatible shapes: [0,32,32,3] vs.
[16]`, exit 1, the work since the last checkpoint lost); the eval step now skips the model
for an empty slice. Each run's eval is compared with a 1-replica `--mode=eval` of the same
checkpoint. Models and data: tests/plugins/batchnorm_plugins.py. Every strategy configuration runs
in its own process (one process cannot host two MirroredStrategies)."""
import json

import pytest

from tests.support.cli import run_trainer, train_ok
from tests.support.processes import TrainerProcess, loopback_only, needs_loopback

_PLUGINS = "tests.plugins.batchnorm_plugins"
_TRAIN = ["--config.train.global_batch_size=12", "--config.train.steps=4",
          "--config.train.steps_per_loop=2", "--config.data.num_train_examples=48",
          "--config.eval.global_batch_size=500", f"--config.data.name={_PLUGINS}:images"]


def _flags(model: str, eval_size: int) -> list[str]:
  return [*_TRAIN, f"--config.model.name={_PLUGINS}:{model}",
          f"--config.data.num_eval_examples={eval_size}"]


def _mirrored(devices: int) -> list[str]:
  return ["--config.runtime.strategy=mirrored", f"--config.runtime.num_cpu_devices={devices}"]


def _eval(model_dir, flags) -> dict:
  """`--mode=eval` of the model_dir's latest checkpoint: its printed metrics."""
  result = run_trainer(model_dir, "--mode=eval", *flags)
  assert result.returncode == 0, f"exit {result.returncode}\n{result.stderr[-4000:]}"
  return json.loads(result.stdout.strip().splitlines()[-1])


def _assert_same_as_one_replica(metrics: dict, model_dir, flags, eval_size: int) -> None:
  """`metrics` ({"loss", "accuracy", "examples"}) equal a 1-replica eval to 1e-5."""
  reference = _eval(model_dir, flags)  # runtime.strategy=default: one replica
  assert reference["examples"] == metrics["examples"] == eval_size
  assert metrics["loss"] == pytest.approx(reference["loss"], abs=1e-5)
  assert metrics["accuracy"] == pytest.approx(reference["accuracy"], abs=1e-5)


def _train_and_compare(model_dir, model: str, eval_size: int, *strategy_flags: str) -> None:
  flags = _flags(model, eval_size)
  summary = train_ok(model_dir, *flags, *strategy_flags)
  assert summary["num_replicas"] > 1
  metrics = {"loss": summary["eval_loss"], "accuracy": summary["eval_accuracy"],
             "examples": summary["eval_examples"]}
  _assert_same_as_one_replica(metrics, model_dir, flags, eval_size)


# 1 example: one replica's slice is empty (the fast case); 7 and 100: partial last batches.
@pytest.mark.parametrize("eval_size", [1, pytest.param(7, marks=pytest.mark.slow),
                                       pytest.param(100, marks=pytest.mark.slow)])
def test_conv_batchnorm_two_replicas_with_an_empty_slice(tmp_path, eval_size):
  _train_and_compare(tmp_path, "conv_batchnorm", eval_size, *_mirrored(2))


@pytest.mark.slow
@pytest.mark.parametrize("eval_size", [1, 7, 100])
def test_conv_batchnorm_three_replicas_with_empty_slices(tmp_path, eval_size):
  _train_and_compare(tmp_path, "conv_batchnorm", eval_size, *_mirrored(3))


@pytest.mark.slow
def test_conv_batchnorm_with_jit_compiled_steps(tmp_path):
  _train_and_compare(tmp_path, "conv_batchnorm", 7, *_mirrored(2),
                     "--config.runtime.jit_compile=true")


@pytest.fixture(scope="module", params=[2], ids=["2_replicas"])
def mobilenet(request, tmp_path_factory):
  """MobileNetV3Small trained on mirrored, its final eval over 100 examples compared with one
  replica here: (model_dir, devices). Training it costs 1-3 min, so eval sizes 1 and 7
  evaluate this checkpoint with `--mode=eval` on the same replicas (the same eval path).
  Two replicas only: a real architecture's BatchNorm layers (depthwise, squeeze-excite)
  on an empty slice is the point; three replicas' slices are conv_batchnorm's (above)."""
  devices = request.param
  model_dir = tmp_path_factory.mktemp(f"mobilenet_{devices}")
  _train_and_compare(model_dir, "mobilenet_v3_small", 100, *_mirrored(devices))
  return model_dir, devices


@pytest.mark.slow
@pytest.mark.parametrize("eval_size", [1, 7])  # and 100: the fixture's training run
def test_mobilenet_v3_small_with_empty_slices(mobilenet, eval_size):
  model_dir, devices = mobilenet
  flags = _flags("mobilenet_v3_small", eval_size)
  metrics = _eval(model_dir, [*flags, *_mirrored(devices)])
  _assert_same_as_one_replica(metrics, model_dir, flags, eval_size)


@pytest.mark.slow
@needs_loopback
def test_two_workers_one_with_an_empty_slice(tmp_path):
  """One eval example: worker 1 reads an empty slice of every eval batch."""
  flags = _flags("conv_batchnorm", 1)
  job = TrainerProcess(None, "--num_workers=2", "--", f"--model_dir={tmp_path}", *flags,
                       module="trainer.launch", prefix=loopback_only())
  try:
    assert job.wait(timeout=300) == 0, job.output[-3000:]
  finally:
    job.kill()
  summary = json.loads((tmp_path / "summary.json").read_text())
  assert summary["strategy"] == "multi_worker_mirrored" and summary["num_replicas"] == 2
  metrics = {"loss": summary["eval_loss"], "accuracy": summary["eval_accuracy"],
             "examples": summary["eval_examples"]}
  _assert_same_as_one_replica(metrics, tmp_path, flags, 1)


@pytest.mark.slow
def test_two_replicas_report_the_eval_of_their_checkpoint(tmp_path):
  """Keras 3's BatchNormalization moving statistics are mirrored with aggregation NONE:
  each replica's update changes only its own copy, and the copies drift apart with
  their shares of each batch. The eval at the end of training ran on every replica's
  own copy (summary.json 1.09261) while the checkpoint holds the first replica's
  (`--mode=eval` 1.09281): the train loop now ends with every replica holding the
  checkpoint's copy. Eval batches of 16 give both replicas examples."""
  flags = [*_flags("conv_batchnorm", 64), "--config.train.steps=60",
           "--config.train.steps_per_loop=10", "--config.eval.global_batch_size=16"]
  summary = train_ok(tmp_path, *flags, *_mirrored(2))
  for strategy in ([], _mirrored(2)):  # 1 replica, and 2 as in training
    reference = _eval(tmp_path, [*flags, *strategy])
    assert reference["step"] == summary["step"] == 60
    assert summary["eval_loss"] == pytest.approx(reference["loss"], abs=1e-6)
    assert summary["eval_accuracy"] == pytest.approx(reference["accuracy"], abs=1e-6)
