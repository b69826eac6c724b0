"""runtime.loggers: every tracker gets each step once, whatever stopped the run
(trainer/reporters/fan_out.py), and a tracker never stops training.

One sequence, every tracker at once (W&B offline, MLflow against a real tracking
server, a user's `Recorder`, next to TensorBoard and metrics.csv): 300 one-step loops
of the synthetic config, a NaN example at step 27 (a rollback to step 20: steps 21..26
were logged already), a SIGTERM at step 150 (exit 42), a resume SIGKILLed after step
230 (a checkpoint every 20 steps: steps past 220 logged, then trained again), and a
resume to the end. W&B is read back from its offline transaction logs (W&B ignores
`resume` offline: one folder per process, the same run id), MLflow through its REST
API (the full history, not a dict that would hide a step logged twice).
"""
import collections
import csv
import glob
import importlib.util
import json
import os
import re
import signal

import pytest

from tests.outputs.test_mlflow import _rest, tracking_server
from tests.support.cli import run_trainer
from tests.support.processes import TrainerProcess

STEPS = 300
_FLAGS = ["--config=synthetic", f"--config.train.steps={STEPS}", "--config.train.steps_per_loop=1",
          "--config.train.global_batch_size=48", "--config.checkpoint.interval=20",
          "--config.data.num_train_examples=512", "--config.data.num_eval_examples=96",
          "--mode=train_and_eval", "--config.eval.interval=50",
          "--config.train.nonfinite_policy=rollback",
          "--config.data.preprocess=tests.plugins.faults:nan_example"]
_WANDB = importlib.util.find_spec("wandb") is not None


@pytest.fixture(name="sequence", scope="module")
def fixture_sequence(tmp_path_factory):
  """The three processes: (model_dir, W&B's folder, the MLflow server's URL)."""
  if not _WANDB:
    pytest.skip("needs the W&B client (pip install -e '.[wandb]'; .ci/run installs it)")
  root = tmp_path_factory.mktemp("trackers")
  with tracking_server(root) as server:  # skips without MLflow
    yield _sequence(root, server)


def _sequence(root, server):
  model_dir = root / "run"
  env = {"WANDB_MODE": "offline", "WANDB_DIR": str(root), "WANDB_SILENT": "true",
         "DISTLOOP_TRACKER_CALLS": str(root / "calls.jsonl")}
  flags = [*_FLAGS, f"--config.runtime.mlflow_uri={server}",
           "--config.runtime.loggers=tensorboard,csv,wandb,mlflow,"
           "tests.plugins.trackers:Recorder"]
  stopped = TrainerProcess(model_dir, *flags, env=env)
  assert stopped.stop_at(r"step 150/300") == 42, stopped.output[-3000:]
  assert "rolled back to step 20" in stopped.output, stopped.output[-3000:]
  killed = TrainerProcess(model_dir, *flags, env=env)
  try:
    killed.wait_for(r"step 23\d/300")
    killed.send(signal.SIGKILL)
    assert killed.wait() == -signal.SIGKILL
  finally:
    killed.kill()
  resumed = run_trainer(model_dir, *flags, env=env)
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  restored = int(re.search(r"Restored checkpoint at step (\d+)", resumed.stderr).group(1))
  assert restored < 230, restored  # steps past it were logged by the killed process
  return model_dir, root, server


def _each_once(steps) -> None:
  counts = collections.Counter(steps)
  twice = sorted(step for step, n in counts.items() if n > 1)
  missing = sorted(set(range(1, STEPS + 1)) - set(counts))
  assert not twice and not missing, f"logged twice: {twice[:20]}; never: {missing[:20]}"


def _wandb_rows(root) -> list:
  """[(run id, step, {key: value})] of every history row of every offline run folder."""
  from trainer.reporters import wandb_log  # pylint: disable=import-outside-toplevel
  from wandb.proto import wandb_internal_pb2  # pylint: disable=import-outside-toplevel
  rows = []
  for path in sorted(glob.glob(f"{root}/wandb/offline-run-*/run-*.wandb")):
    run_id = os.path.basename(path)[len("run-"):-len(".wandb")]
    for data in wandb_log.records(path):
      record = wandb_internal_pb2.Record.FromString(data)
      if record.WhichOneof("record_type") == "history":
        rows.append((run_id, record.history.step.num,
                     {item.key or "/".join(item.nested_key): json.loads(item.value_json)
                      for item in record.history.item}))
  return rows


def _wandb_records(root, kind: str) -> list:
  from trainer.reporters import wandb_log  # pylint: disable=import-outside-toplevel
  from wandb.proto import wandb_internal_pb2  # pylint: disable=import-outside-toplevel
  found = []
  for path in sorted(glob.glob(f"{root}/wandb/offline-run-*/run-*.wandb")):
    for data in wandb_log.records(path):
      record = wandb_internal_pb2.Record.FromString(data)
      if record.WhichOneof("record_type") == kind:
        found.append(getattr(record, kind))
  return found


@pytest.mark.slow
def test_wandb_holds_each_step_once_in_one_run(sequence):
  """Catches: a resumed or rolled back run logging a step again (W&B keeps both), the
  steps a SIGKILLed process logged lost (W&B writes its log every 15 s: they are sent
  again from metrics.csv), a second W&B run id, the config or summary missing."""
  model_dir, root, _ = sequence
  rows = _wandb_rows(root)
  run_ids = {run_id for run_id, _, _ in rows}
  assert run_ids == {json.loads((model_dir / "wandb_run.json").read_text())["run_id"]}
  _each_once(step for _, step, values in rows if "train/loss" in values)
  assert [step for _, step, values in rows if "eval/accuracy" in values] == [50, 100, 150, 200,
                                                                              250, 300]
  configs = [{item.key for item in run.config.update} for run in _wandb_records(root, "run")]
  assert sum("train" in keys for keys in configs) == 1, configs  # sent once, when created
  summaries = {item.key: item.value_json for summary in _wandb_records(root, "summary")
               for item in summary.update}
  assert json.loads(summaries["step"]) == STEPS and "eval_accuracy" in summaries, summaries


@pytest.mark.slow
def test_mlflow_history_holds_each_step_once(sequence):
  """Catches: the steps between the last checkpoint and a SIGKILL (and those a rollback
  retrains) logged again on resume: MLflow keeps both values and draws both."""
  model_dir, _, server = sequence
  run_id = json.loads((model_dir / "mlflow_run.json").read_text())["run_id"]
  experiment = _rest(server, "experiments/get-by-name", experiment_name="distloop")
  runs = _rest(server, "runs/search", {"experiment_ids": [experiment["experiment"]
                                                          ["experiment_id"]]})["runs"]
  assert [run["info"]["run_id"] for run in runs] == [run_id]
  assert runs[0]["info"]["status"] == "FINISHED"
  for key in ("train/loss", "train/learning_rate"):
    history = _rest(server, "metrics/get-history", run_id=run_id, metric_key=key,
                    max_results=10_000)["metrics"]
    _each_once(metric["step"] for metric in history)


@pytest.mark.slow
def test_mlflow_holds_the_params_the_values_and_the_export(sequence):
  """Catches: params not sent (or sent again on a resume: MLflow refuses a changed
  param), values that differ from what metrics.csv says, the export not uploaded."""
  model_dir, _, server = sequence
  run_id = json.loads((model_dir / "mlflow_run.json").read_text())["run_id"]
  run = _rest(server, "runs/get", run_id=run_id)["run"]
  params = {p["key"]: p["value"] for p in run["data"]["params"]}
  assert params["train.steps"] == str(STEPS) and params["model.name"] == "mnist_cnn"
  with open(model_dir / "metrics.csv", newline="") as f:
    logged = {(int(r["step"]), f"{r['split']}/{r['name']}"): float(r["value"])
              for r in csv.DictReader(f)}
  for key in ("train/loss", "train/accuracy", "eval/loss", "eval/accuracy"):
    history = _rest(server, "metrics/get-history", run_id=run_id, metric_key=key,
                    max_results=10_000)["metrics"]
    # Steps 21..26 (rolled back) and those the SIGKILLed process logged last keep the
    # values MLflow got first; metrics.csv those of the run that went on.
    kept = {m["step"]: m["value"] for m in history if not 20 < m["step"] < 240}
    assert kept and kept == {step: logged[step, key] for step in kept}, key
  files = {os.path.basename(f["path"]) for f in
           _rest(server, "artifacts/list", run_id=run_id, path=f"export/{STEPS}").get("files", [])}
  assert "saved_model.pb" in files, files


@pytest.mark.slow
def test_a_users_tracker_gets_what_the_built_in_trackers_get(sequence):
  """The user's Recorder: each process checked, started, rewound to its restored step
  (and once more at the rollback), closed (but the SIGKILLed one); the last finished.
  Its writes are what MLflow holds, value for value (W&B's log lost what the SIGKILLed
  process logged last: it was sent again, with the resumed run's throughput; the
  losses are the same). Catches: a user's class called differently from the
  built-ins (skipped steps handed to it, a rewind or finish missing)."""
  model_dir, root, server = sequence
  run_id = json.loads((model_dir / "mlflow_run.json").read_text())["run_id"]
  calls = [json.loads(line) for line in (root / "calls.jsonl").read_text().splitlines()]
  kinds = [call[0] for call in calls]
  assert kinds.count("check") == kinds.count("start") == 3, kinds
  assert kinds.count("close") == 2, kinds  # not the SIGKILLed process
  assert kinds.count("finish") == 1 and kinds[-2:] == ["finish", "close"], kinds[-5:]
  rewinds = [call[1] for call in calls if call[0] == "rewind"]
  assert rewinds[:2] == [0, 20] and len(rewinds) == 4, rewinds  # 0, the rollback, 2 resumes
  written = {(call[1], call[2]): call[3] for call in calls if call[0] == "write"}
  assert len(written) == len([call for call in calls if call[0] == "write"])
  _each_once(step for step, split in written if split == "train")
  logged = {(step, f"{split}/{name}"): value for (step, split), values in written.items()
            for name, value in values.items()}
  mlflow = {}
  for key in {key for _, key in logged}:
    for metric in _rest(server, "metrics/get-history", run_id=run_id, metric_key=key,
                        max_results=10_000)["metrics"]:
      mlflow[metric["step"], key] = metric["value"]
  assert logged == pytest.approx(mlflow, rel=1e-12, abs=0)  # the same calls, value for value
  wandb = {(step, key): value for _, step, values in _wandb_rows(root)
           for key, value in values.items() if key in ("train/loss", "eval/loss")}
  assert wandb == {key: value for key, value in logged.items() if key[1] in ("train/loss",
                                                                              "eval/loss")}


_SHORT = ["--config=synthetic", "--config.train.steps=6", "--config.train.steps_per_loop=1",
          "--config.data.num_train_examples=64"]


def test_a_tracker_that_fails_mid_run_costs_one_warning(tmp_path):
  """Catches: a tracker's exception ending the run, or a warning per step."""
  result = run_trainer(tmp_path / "run", *_SHORT,
                       "--config.runtime.loggers=csv,tests.plugins.trackers:FailsAtStep3")
  assert result.returncode == 0, result.stderr[-3000:]
  warned = [line for line in result.stderr.splitlines() if "runtime.loggers:" in line]
  assert len(warned) == 1, warned
  assert "FailsAtStep3's write failed (ConnectionError" in warned[0], warned
  steps = [line.split(",")[0] for line in (tmp_path / "run" / "metrics.csv").read_text()
           .splitlines()[1:] if ",train,loss," in line]
  assert steps == ["1", "2", "3", "4", "5", "6"]


def test_a_tracker_that_cannot_be_reached_is_one_line_and_leaves_nothing(tmp_path):
  """Catches: a run that trains without the tracker it was asked for, or a traceback."""
  result = run_trainer(tmp_path / "run", *_SHORT,
                       "--config.runtime.loggers=tensorboard,tests.plugins.trackers:Unreachable")
  assert result.returncode == 2, result.stderr[-3000:]
  (line,) = result.error_lines()
  assert "Unreachable cannot report" in line and "no route to tracker.example.com" in line, line
  assert not (tmp_path / "run").exists()
