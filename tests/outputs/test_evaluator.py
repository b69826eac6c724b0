"""The evaluator task (TF_CONFIG task type `evaluator`): it evaluates each new checkpoint of
the shared model_dir on a local strategy and exits 0 after the final step; the training
tasks never count it. End to end through `python -m trainer.launch --num_evaluators=1`."""
import glob
import json
import os
import re

import pytest
from tensorboard.backend.event_processing import event_accumulator
from tensorboard.util import tensor_util

import configs
from tests.support.cli import run_trainer
from tests.support.processes import TrainerProcess, loopback_only, needs_loopback
from trainer import api
from trainer.errors import UserError

_CLUSTER = {"worker": ["127.0.0.1:2001", "127.0.0.1:2002"], "evaluator": ["127.0.0.1:2003"]}


def _tf_config(monkeypatch, task_type: str, index: int = 0, cluster=None) -> None:
  monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": cluster or _CLUSTER,
                                              "task": {"type": task_type, "index": index}}))


@pytest.mark.parametrize("mode, runs", [("train", "continuous_eval"),
                                        ("train_and_eval", "continuous_eval"),
                                        ("continuous_eval", "continuous_eval"),
                                        ("eval", "eval")])
def test_an_evaluator_task_evaluates_whatever_the_shared_mode(monkeypatch, mode, runs):
  """Catches: an evaluator that trains (it would join no cluster and write model_dir as a
  second chief) because every task was given the same --mode=train."""
  _tf_config(monkeypatch, "evaluator")
  assert api.is_evaluator_task()
  assert api.task_mode(mode) == runs


def test_an_evaluator_task_refuses_export(monkeypatch):
  _tf_config(monkeypatch, "evaluator")
  with pytest.raises(UserError, match="evaluator task"):
    api.task_mode("export")


@pytest.mark.parametrize("task_type", ["worker", "chief", "ps"])
def test_training_tasks_keep_their_mode(monkeypatch, task_type):
  _tf_config(monkeypatch, task_type)
  assert not api.is_evaluator_task()
  assert api.task_mode("train") == "train" and api.task_mode("export") == "export"


def test_a_tf_config_that_is_no_json_object_is_one_line(monkeypatch):
  monkeypatch.setenv("TF_CONFIG", "[1, 2]")
  with pytest.raises(UserError, match="TF_CONFIG is not valid JSON"):
    api.task_mode("train")


def test_the_evaluator_runs_a_local_strategy_on_a_copy_of_the_config():
  """Catches: an evaluator building MultiWorkerMirroredStrategy (it would wait for the
  workers as a peer, or be counted in their all-reduce), and a config changed in place."""
  config = configs.get("synthetic")
  config.runtime.strategy = "multi_worker_mirrored"
  assert api._local(config).runtime.strategy == "mirrored"  # pylint: disable=protected-access
  assert config.runtime.strategy == "multi_worker_mirrored"
  config.runtime.strategy = "one_device"
  assert api._local(config).runtime.strategy == "one_device"  # pylint: disable=protected-access


@pytest.mark.parametrize("cluster, workers", [
    (_CLUSTER, 2),
    ({"chief": ["127.0.0.1:2000"], "worker": ["127.0.0.1:2001"],
      "evaluator": ["127.0.0.1:2003"]}, 2),
])
def test_a_workers_cluster_leaves_the_evaluator_out(monkeypatch, cluster, workers):
  """Catches: the evaluator job passed to the training strategy (TFConfigClusterResolver
  keeps it): a worker count of 3 would make every worker's data shard and memory check
  wrong, and the strategy's servers would list a task that never serves."""
  from trainer.cluster import runtime  # pylint: disable=g-import-not-at-top  (TensorFlow)
  _tf_config(monkeypatch, "worker", 0, cluster)
  resolver = runtime.cluster_resolver(configs.get("synthetic").runtime)
  assert "evaluator" not in resolver.cluster_spec().as_dict()
  assert resolver.cluster_spec().as_dict() == {k: v for k, v in cluster.items()
                                               if k != "evaluator"}
  assert (resolver.task_type, resolver.task_id) == ("worker", 0)

  class Strategy:  # what num_workers and is_chief read of a multi-worker strategy
    cluster_resolver = resolver
  assert runtime.num_workers(Strategy()) == workers
  assert runtime.is_chief(Strategy()) == ("chief" not in cluster)


def test_export_on_an_evaluator_task_exits_2_with_one_line(tmp_path):
  model_dir = tmp_path / "run"
  env = {"TF_CONFIG": json.dumps({"cluster": _CLUSTER,
                                  "task": {"type": "evaluator", "index": 0}})}
  result = run_trainer(model_dir, "--config=synthetic", "--mode=export", env=env, timeout=120)
  assert result.returncode == 2, result.stderr[-3000:]
  assert len(result.error_lines()) == 1 and "evaluator task" in result.stderr, result.stderr
  assert not model_dir.exists()


# -- end to end: two workers and an evaluator through the launcher ---------------------

_STEPS = 60
_FLAGS = ["--config=synthetic", f"--config.train.steps={_STEPS}",
          "--config.train.global_batch_size=48", "--config.train.steps_per_loop=5",
          "--config.checkpoint.interval=20", "--config.checkpoint.max_to_keep=5",
          "--config.data.num_train_examples=1000", "--config.data.num_eval_examples=500",
          "--config.runtime.deterministic=true", "--config.eval.poll_seconds=1"]


def _scalars(path: str) -> dict[str, dict[int, float]]:
  """{tag: {step: value}} of one TensorBoard events file."""
  accumulator = event_accumulator.EventAccumulator(path,
                                                   size_guidance={event_accumulator.TENSORS: 0})
  accumulator.Reload()
  return {tag: {event.step: float(tensor_util.make_ndarray(event.tensor_proto))
                for event in accumulator.Tensors(tag)}
          for tag in accumulator.Tags()["tensors"]}


@pytest.mark.slow
@needs_loopback
def test_an_evaluator_beside_two_workers_matches_eval_of_the_final_step(tmp_path):
  """Catches: an evaluator that joins (or blocks) the workers' cluster, takes the writer
  lock, never ends after the final step, or evaluates other weights or examples than
  --mode=eval does; a launcher that kills it when training ends."""
  model_dir = tmp_path / "run"
  job = TrainerProcess(None, "--num_workers=2", "--num_evaluators=1", "--",
                       f"--model_dir={model_dir}", *_FLAGS, module="trainer.launch",
                       prefix=loopback_only())
  code = job.finish(400)
  output = job.output
  assert code == 0, output[-4000:]
  assert "[evaluator-0] " in output and "This task is the evaluator" in output, output[-4000:]
  assert f"the final step {_STEPS} is done" in output, output[-4000:]
  assert "[launch] evaluator-0 evaluated the final step (exit 0)" in output
  # A restart's cause: the lines of the process that failed, and the launcher's.
  failure = "\n".join(line for line in output.splitlines()
                      if line.startswith("[launch]") or "error" in line.lower())
  assert "the evaluator failed" not in output and "restart" not in output, failure[-6000:]
  evaluated = [int(step) for step in re.findall(r"\[evaluator-0\] .*eval at step (\d+) \|",
                                                output)]
  assert evaluated and evaluated[-1] == _STEPS and evaluated == sorted(set(evaluated)), evaluated

  # The evaluator's own events file (the chief's final eval writes one too).
  pid = re.search(r"\[launch\] started evaluator-0 \(pid (\d+)\)", output).group(1)
  files = [f for f in glob.glob(f"{model_dir}/tensorboard/eval/events.out.tfevents.*")
           if f".{pid}." in os.path.basename(f)]
  assert len(files) == 1, os.listdir(f"{model_dir}/tensorboard/eval")
  scalars = _scalars(files[0])

  result = run_trainer(model_dir, "--mode=eval", timeout=300)  # config.json, no TF_CONFIG
  assert result.returncode == 0, result.stderr[-3000:]
  expected = json.loads(result.stdout.strip().splitlines()[-1])
  assert expected["step"] == _STEPS and expected["examples"] == 500
  for name in ("loss", "accuracy"):
    assert sorted(scalars[name]) == evaluated, name
    assert scalars[name][_STEPS] == pytest.approx(expected[name], abs=1e-6, rel=0), name
