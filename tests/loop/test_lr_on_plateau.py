"""train.lr_on_plateau (Keras's ReduceLROnPlateau at each eval) and an Action that sets the
learning rate factor: the rate metrics.csv reports drops by `factor` after `patience` evals
without a gain, not before, waits out `cooldown`, never goes below `min_lr`; the factor an
Action set survives a resume; 2 workers drop it as 2 replicas do; a combination that cannot
act is refused in one line. Resumes of the plateau itself, SIGTERMed and SIGKILLed, on every
shape: the guarantee matrix's `cnn` workload runs with it (tests/guarantees/workloads/cnn.py);
`test_the_cnn_workload_drops_its_factor_twice` checks that it does."""
import csv
import json
import os

import numpy as np
import pytest

from tests.support.cli import run_trainer, train_ok
from tests.support.processes import (TrainerProcess, assert_same_state, checkpoint_arrays,
                                     loopback_only, needs_loopback, read_checkpoint)


def _config(steps=20, **plateau):
  """synthetic, a tiny CNN, plain SGD at 0.1, loops of 2, an eval every 2 steps."""
  import configs  # pylint: disable=g-import-not-at-top
  config = configs.get("synthetic")
  config.unlock()
  config.train.steps, config.train.steps_per_loop, config.eval.interval = steps, 2, 2
  config.data.num_train_examples, config.data.num_eval_examples = 256, 64
  config.model.conv_filters, config.model.dense_units = 4, 8
  config.train.optimizer, config.train.learning_rate = "sgd", 0.1
  config.runtime.deterministic = True
  for name, value in plateau.items():
    setattr(config.train.lr_on_plateau, name, value)
  return config


def _rates(model_dir) -> dict:
  """metrics.csv's learning_rate by step (the rate of the step after it)."""
  with open(os.path.join(model_dir, "metrics.csv"), newline="") as f:
    return {int(row["step"]): float(row["value"]) for row in csv.DictReader(f)
            if row["split"] == "train" and row["name"] == "learning_rate"}


def _expected(base: float, factors: dict) -> dict:
  """{step: float32(base) * float32(factor)}, as the step computes it."""
  return {step: float(np.float32(base) * np.float32(factor)) for step, factor in factors.items()}


# Accuracy must gain more than 1 to count: only the first eval (step 2) sets a best.
_NO_GAIN = dict(metric="accuracy", mode="max", min_delta=1.0)


def test_the_rate_drops_after_patience_evals_waits_out_cooldown_and_stops_at_min_lr(tmp_path):
  """Evals at 2, 4, ..., 20; patience 2: the first drop at 6 (not at 4); cooldown 2 (Keras
  counts it down before it looks: evals 8, 10 skipped, 10 counting again), so the next at 12
  and 18, where 0.25 * 0.5 stops at min_lr / learning_rate = 0.15. Each row is the rate of
  the step after it: the decision at 6 shows from 8 on. Catches: a drop one eval early or
  late, cooldown ignored (drops at 6, 10, 14), min_lr not applied (0.0125 at 20), the factor
  not reaching the compiled step, the factor saved as a checkpointed variable."""
  import trainer  # pylint: disable=g-import-not-at-top
  trainer.run(_config(factor=0.5, patience=2, cooldown=2, min_lr=0.015, **_NO_GAIN),
              str(tmp_path), mode="train_and_eval")
  factors = {2: 1, 4: 1, 6: 1, 8: .5, 10: .5, 12: .5, 14: .25, 16: .25, 18: .25, 20: .15}
  assert _rates(tmp_path) == _expected(0.1, factors)
  with open(tmp_path / "checkpoints" / "20" / "meta" / "metadata") as f:
    saved = json.load(f)["actions"]
  assert saved["learning_rate"] == {"factor": 0.15}, saved
  assert saved["lr_on_plateau"]["cooldown_counter"] == 1, saved  # 18's 2, then 20's eval
  keys = list(checkpoint_arrays(tmp_path, 20))  # the factor: JSON in the meta, not a variable
  assert not [key for key in keys if "factor" in key or "learning_rate" in key], keys


def _workload_config():
  """The guarantee matrix's cnn workload on 1 replica, as its flags say."""
  import configs  # pylint: disable=g-import-not-at-top
  from tests.guarantees import catalogue  # pylint: disable=g-import-not-at-top
  flags = [*catalogue.BY_NAME["cnn"].flags, *catalogue.COMMON, *catalogue.EVALS]
  config = configs.get(next(f.split("=", 1)[1] for f in flags if f.startswith("--config=")))
  config.unlock()
  mode = None
  for flag in flags:
    key, _, value = flag[2:].partition("=")
    if key == "mode":
      mode = value
    elif key.startswith("config."):
      *path, leaf = key.split(".")[1:]
      node = config
      for part in path:
        node = node[part]
      old = node[leaf]
      node[leaf] = value == "true" if isinstance(old, bool) else type(old)(value)
  return config, mode


def test_the_cnn_workload_drops_its_factor_twice(tmp_path):
  """What puts the plateau under every check of the guarantee matrix: its cnn workload
  halves the rate at the evals of 20 and 30 (and 40, saved), so the SIGKILLed run resumes
  step 30 at 0.25. Catches: a workload whose plateau never acts (the matrix would then
  check nothing of it)."""
  import trainer  # pylint: disable=g-import-not-at-top
  config, mode = _workload_config()
  trainer.run(config, str(tmp_path), mode=mode)
  rates = _rates(tmp_path)
  factors = {5: 1, 10: 1, 15: 1, 20: 1, 25: .5, 30: .5, 35: .25, 40: .25}
  assert rates == _expected(config.train.learning_rate, factors), rates
  with open(tmp_path / "checkpoints" / "30" / "meta" / "metadata") as f:
    assert json.load(f)["actions"]["learning_rate"] == {"factor": 0.25}


def _tenth_at_8(boundary):
  if boundary.step == 8:
    boundary.set_learning_rate_factor(boundary.learning_rate_factor * 0.1)


def test_an_action_sets_the_factor_and_a_resume_keeps_it(tmp_path):
  """An Action with sets_learning_rate=True divides the rate by 10 at step 8; a run stopped
  at 12 and resumed to 20 (the action does nothing there: the factor comes from step 12's
  checkpoint) equals the run to 20 in one go: every rate, the weights bit for bit. Catches:
  the factor not saved, or not assigned again on restore (the resumed steps at 10x the
  rate), the factor not reaching the step."""
  import trainer  # pylint: disable=g-import-not-at-top

  def action():
    return trainer.Action(_tenth_at_8, every_steps=4, sets_learning_rate=True)
  whole, resumed = tmp_path / "whole", tmp_path / "resumed"
  trainer.run(_config(steps=20), str(whole), mode="train", actions=[action()])
  trainer.run(_config(steps=12), str(resumed), mode="train", actions=[action()])
  trainer.run(_config(steps=20), str(resumed), mode="train", actions=[action()])
  factors = {step: 1 if step <= 8 else 0.1 for step in range(2, 21, 2)}
  assert _rates(whole) == _expected(0.1, factors)
  assert _rates(resumed) == _rates(whole)
  assert_same_state(checkpoint_arrays(resumed, 20), checkpoint_arrays(whole, 20), atol=0.0)


def test_an_action_that_sets_the_factor_undeclared_is_one_line(tmp_path):
  import trainer  # pylint: disable=g-import-not-at-top
  from trainer.errors import UserCodeError  # pylint: disable=g-import-not-at-top
  with pytest.raises(UserCodeError) as raised:
    trainer.run(_config(steps=8), str(tmp_path), mode="train",
                actions=[trainer.Action(_tenth_at_8, every_steps=4)])
  message = str(raised.value)
  assert message.startswith("action '_tenth_at_8' called boundary.set_learning_rate_factor("
                            "0.1) at step 8 without declaring it"), message
  assert "sets_learning_rate=True" in message and "\n" not in message


@pytest.mark.parametrize("fields, mode, says", [
    (dict(factor=1.0), "train_and_eval", "train.lr_on_plateau.factor=1.0 must be in [0.0, 1.0)"),
    (dict(factor=0.5, metric="precision"), "train_and_eval",
     "train.lr_on_plateau.metric='precision' is not reported (choose from: loss, accuracy)"),
    (dict(factor=0.5, min_lr=0.2), "train_and_eval",
     "train.lr_on_plateau.min_lr=0.2 must not exceed train.learning_rate=0.1"),
    (dict(factor=0.5), "train", "train.lr_on_plateau.factor=0.5 needs evals during training"),
    (dict(factor=0.5, optimizer="tests.plugins.keras_plugins:halving_schedule"), "train_and_eval",
     "builds its own: use a built-in optimizer"),
])
def test_a_combination_that_cannot_act_is_refused_before_anything_is_written(
    tmp_path, fields, mode, says):
  import trainer  # pylint: disable=g-import-not-at-top
  from trainer.errors import UserError  # pylint: disable=g-import-not-at-top
  config = _config(**{k: v for k, v in fields.items() if k != "optimizer"})
  if "optimizer" in fields:
    config.train.optimizer = fields["optimizer"]
  with pytest.raises(UserError) as raised:
    trainer.run(config, str(tmp_path / "run"), mode=mode)
  assert says in str(raised.value) and "\n" not in str(raised.value), str(raised.value)
  assert not (tmp_path / "run").exists()


def test_the_cli_refuses_it_in_one_line_exit_2(tmp_path):
  result = run_trainer(tmp_path / "run", "--config=synthetic",
                       "--config.train.lr_on_plateau.factor=0.5")
  assert result.returncode == 2
  (line,) = result.error_lines()
  assert "needs evals during training: --mode=train_and_eval" in line, line
  assert not (tmp_path / "run").exists()


_AT_EVERY_BOUNDARY = ["--config=synthetic", "--mode=train_and_eval", "--config.train.steps=60",
                      "--config.train.global_batch_size=32", "--config.train.steps_per_loop=20",
                      "--config.eval.interval=20", "--config.checkpoint.interval=20",
                      "--config.data.num_train_examples=256",
                      "--config.data.num_eval_examples=64", "--config.model.conv_filters=4",
                      "--config.model.dense_units=8", "--config.train.optimizer=sgd",
                      "--config.train.learning_rate=0.05", "--config.runtime.deterministic=true",
                      "--config.train.lr_on_plateau.factor=0.5",
                      "--config.train.lr_on_plateau.patience=1",
                      "--config.train.lr_on_plateau.metric=accuracy",
                      "--config.train.lr_on_plateau.mode=max",
                      "--config.train.lr_on_plateau.min_delta=1"]
_TIMING = ("examples_per_sec", "steps_per_sec")


def _rows(model_dir) -> dict:
  """metrics.csv: {(step, split, name): value}, timings left out."""
  with open(os.path.join(model_dir, "metrics.csv"), newline="") as f:
    return {(int(row["step"]), row["split"], row["name"]): float(row["value"])
            for row in csv.DictReader(f) if row["name"] not in _TIMING}


@pytest.mark.slow
def test_a_sigterm_before_an_eval_resumes_at_the_uninterrupted_runs_factor(tmp_path):
  """Evals at 20 (the best), 40 and 60 (each a drop), every boundary an eval's. SIGTERM
  once step 20 is logged: agreed right after the loop to 40, whose step is saved before
  its eval runs. The resumed process evaluates step 40 and judges it before its first
  loop: metrics.csv (every value but timings) and the weights equal the uninterrupted
  run's exactly. Catches: the eval of a signal's step never judged (steps 41-60 at factor
  1, not 0.5), the factor not restored, a drop judged twice."""
  whole, resumed = tmp_path / "whole", tmp_path / "resumed"
  train_ok(whole, *_AT_EVERY_BOUNDARY)
  process = TrainerProcess(resumed, *_AT_EVERY_BOUNDARY)
  assert process.stop_at(r"step 20/60") == 42, process.output[-3000:]
  assert "preempted at step 40" in process.output, process.output[-3000:]
  train_ok(resumed, *_AT_EVERY_BOUNDARY)
  assert _rates(whole) == _expected(0.05, {20: 1, 40: 1, 60: .5})
  assert _rows(resumed) == _rows(whole)
  assert_same_state(checkpoint_arrays(resumed, 60), checkpoint_arrays(whole, 60), atol=0.0)


_CLUSTER_FLAGS = ["--config=synthetic", "--mode=train_and_eval", "--config.train.steps=20",
                  "--config.train.global_batch_size=32", "--config.train.steps_per_loop=5",
                  "--config.eval.interval=5", "--config.checkpoint.interval=10",
                  "--config.data.num_train_examples=256", "--config.data.num_eval_examples=64",
                  "--config.model.conv_filters=4", "--config.model.dense_units=8",
                  "--config.train.optimizer=sgd", "--config.train.learning_rate=0.05",
                  "--config.runtime.deterministic=true",
                  "--config.train.lr_on_plateau.factor=0.5",
                  "--config.train.lr_on_plateau.patience=1",
                  "--config.train.lr_on_plateau.metric=accuracy",
                  "--config.train.lr_on_plateau.mode=max",
                  "--config.train.lr_on_plateau.min_delta=1"]


@pytest.mark.slow
@needs_loopback
def test_two_workers_stopped_and_resumed_drop_the_rate_as_two_replicas_do(tmp_path):
  """trainer.launch, 2 workers (the factor agreed: the chief's wins), SIGTERMed once step 5
  is logged (agreed at 10, or at 15 on a loaded machine: saved before its eval) and
  launched again, against one process
  of 2 replicas: the same drops (10, 15, 20) in metrics.csv, each worker logging each once,
  the same weights. Catches: a factor assigned on one worker only (the replicas' updates
  differ: the weights drift apart), a restore or a catch-up eval on one worker only (a
  collective left waiting: the timeout), an agreement run at other boundaries on one
  worker."""
  replicas = tmp_path / "replicas"
  train_ok(replicas, *_CLUSTER_FLAGS, "--config.runtime.strategy=mirrored",
           "--config.runtime.num_cpu_devices=2")
  workers, output = tmp_path / "workers", ""
  for stop in (True, False):
    job = TrainerProcess(None, "--num_workers=2", "--", f"--model_dir={workers}",
                         *_CLUSTER_FLAGS, module="trainer.launch", prefix=loopback_only())
    try:
      code = job.stop_at(r"\[worker-0\].*step 5/") if stop else job.wait()
    finally:
      job.kill()
    assert code == (42 if stop else 0), job.output[-3000:]
    output += job.output
  assert "[worker-1]" in output and "Restored checkpoint at step 1" in output, output[-3000:]
  for worker in ("worker-0", "worker-1"):
    assert sum(f"[{worker}]" in line and "lr_on_plateau: accuracy" in line
               for line in output.splitlines()) == 3, output[-3000:]
  factors = {5: 1, 10: 1, 15: .5, 20: .25}
  assert _rates(replicas) == _expected(0.05, factors)
  assert _rows(workers) == _rows(replicas)
  assert_same_state(read_checkpoint(workers, 20), read_checkpoint(replicas, 20), atol=1e-6)


@pytest.mark.slow
@needs_loopback
def test_parameter_server_workers_train_at_the_factor_the_coordinator_sets(tmp_path):
  """parameter_server (trainer.launch, 2 workers, 1 server): the factor lives on the server,
  the coordinator assigns it, the workers' steps read it: the rates each loop returns (a
  worker's reading) drop at 10, 15, 20. Catches: a factor the workers never see (a copy on
  the coordinator), an assignment that fails across processes."""
  flags = [flag for flag in _CLUSTER_FLAGS if "deterministic" not in flag]
  job = TrainerProcess(None, "--num_workers=2", "--num_ps=1", "--", f"--model_dir={tmp_path}",
                       *flags, module="trainer.launch", prefix=loopback_only())
  try:
    assert job.wait() == 0, job.output[-3000:]
  finally:
    job.kill()
  assert json.loads((tmp_path / "summary.json").read_text())["strategy"] == "parameter_server"
  assert _rates(tmp_path) == _expected(0.05, {5: 1, 10: 1, 15: .5, 20: .25})
