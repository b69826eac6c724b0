"""`python -m trainer.inspect --step=N` names the rows global batch N read, per replica:
the rows the job's own step recorded (tests/plugins/inspect_plugins.py), on 1 and 2
replicas, across a SIGTERM and a resume that changes the batch size."""
import json
import subprocess
import sys

import pytest

from trainer.inspect import batches as inspect_batches
from tests.support.cli import REPO, run_trainer, user_environment
from tests.support.processes import TrainerProcess

PLUGINS = "tests.plugins.inspect_plugins"
STEPS = 9


def _flags(replicas: int) -> list[str]:
  shape = ([] if replicas == 1 else ["--config.runtime.strategy=mirrored",
                                     f"--config.runtime.num_cpu_devices={replicas}"])
  return ["--config=synthetic", f"--config.data.name={PLUGINS}:indexed",
          f"--config.train.task={PLUGINS}:RecordsItsRows", f"--config.train.steps={STEPS}",
          "--config.train.steps_per_loop=1", "--config.train.global_batch_size=16",
          "--config.checkpoint.interval=2", "--config.checkpoint.max_to_keep=2",
          "--mode=train", *shape]


def _recorded(path) -> dict:
  """{(step, replica): rows}: the last record of each (a step trained again after the
  resume is the one that counts)."""
  found = {}
  for line in path.read_text().splitlines():
    entry = json.loads(line)
    found[(entry["step"], entry["replica"])] = entry["rows"]
  return found


@pytest.mark.slow
@pytest.mark.parametrize("replicas", [1, 2])
def test_inspect_names_the_rows_each_step_read(tmp_path, replicas):
  """SIGTERM at step 3, resumed with a batch of 24 (the position is counted in examples):
  every step's rows, per replica, as the step saw them. Steps whose checkpoints were
  dropped (max_to_keep=2) come from the config history: a batch size read from today's
  config, a replica's slice taken from the wrong end, an epoch boundary (200 rows) or a
  step off by one fail here."""
  model_dir, recorded = tmp_path / "run", tmp_path / "rows.jsonl"
  env = {"RECORDED_ROWS": str(recorded)}
  stopped = TrainerProcess(model_dir, *_flags(replicas), env=env)
  assert stopped.stop_at(rf"step 3/{STEPS}\b") == 42, stopped.output[-3000:]
  resumed = run_trainer(model_dir, *_flags(replicas), "--config.train.global_batch_size=24",
                        env=env)
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  read = _recorded(recorded)
  assert sorted({step for step, _ in read}) == list(range(1, STEPS + 1)), sorted(read)
  for step in range(1, STEPS + 1):
    found = inspect_batches.batch(str(model_dir), step)
    assert found.replicas == replicas
    assert found.rows == [read[(step, replica)] for replica in range(replicas)], step

  shown = subprocess.run([sys.executable, "-m", "trainer.inspect", f"--model_dir={model_dir}",
                          f"--step={STEPS}", "--json"], capture_output=True, text=True,
                         cwd=REPO, env=user_environment(), timeout=300)
  assert shown.returncode == 0, shown.stderr[-3000:]
  assert json.loads(shown.stdout)["rows"] == [read[(STEPS, r)] for r in range(replicas)]


def test_a_folder_that_is_no_model_dir_is_one_line(tmp_path):
  result = subprocess.run([sys.executable, "-m", "trainer.inspect", f"--model_dir={tmp_path}",
                           "--step=3"], capture_output=True, text=True, cwd=REPO,
                          env=user_environment(), timeout=300)
  assert result.returncode == 2
  assert result.stderr.strip().count("\n") == 0 and "no config.json" in result.stderr
