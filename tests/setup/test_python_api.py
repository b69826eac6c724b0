"""trainer.run from Python: one process trains, resumes, trains another config, and gets
bad input as an exception carrying the CLI's one line; it is never exited."""
import json
import re
import subprocess
import sys

from tests.support.cli import REPO, run_trainer, user_environment

_SCRIPT = r'''
import json, sys
import trainer, configs
from trainer.errors import UserError

model_dir, other_dir = sys.argv[1], sys.argv[2]
results = {}
config = configs.get("synthetic")
config.unlock()
config.train.steps, config.train.steps_per_loop = 20, 10
config.data.num_train_examples = 256
results["first"] = trainer.run(config, model_dir)["step"]
config.train.steps = 40  # the same model_dir again, in the same process: it resumes
results["resumed"] = trainer.run(config, model_dir)["step"]
results["again"] = trainer.run(config, model_dir).get("already_finished")
results["eval"] = trainer.run(config, model_dir, mode="eval")["examples"]
try:  # a name works: it loads, and its data (10,000 examples) is not the run's: refused
  trainer.run("synthetic", model_dir, mode="eval")
except UserError as e:
  results["by_name"] = str(e)
results["by_path"] = trainer.run(model_dir + "/config.json", model_dir, mode="eval")["step"]
results["export"] = trainer.run(config, model_dir, mode="export")

other = configs.get("synthetic")  # a second, different model in the same process
other.unlock()
other.model.name, other.train.optimizer, other.train.steps = "mlp", "momentum", 10
other.data.num_train_examples = 256
results["other"] = trainer.run(other, other_dir)["step"]

auto = configs.get("synthetic")  # Keras numbers these names per process: keys must not
auto.model.name = "tests/plugins/task_plugins.py:auto_named_model"
auto.train.steps, auto.data.num_train_examples = 10, 256
trainer.run(auto, other_dir + "_auto")
auto.train.steps = 20
results["auto_resumed"] = trainer.run(auto, other_dir + "_auto")["step"]

bad = configs.get("synthetic")
bad.unlock()
bad.train.steps = -1
try:
  trainer.run(bad, model_dir + "_bad")
except UserError as e:
  results["error"] = str(e)
results["handlers_left"] = __import__("signal").getsignal(__import__("signal").SIGTERM) is \
    __import__("signal").SIG_DFL
print("RESULTS " + json.dumps(results))
'''


def test_one_process_trains_resumes_and_trains_another_config(tmp_path):
  completed = subprocess.run(
      [sys.executable, "-c", _SCRIPT, str(tmp_path / "run"), str(tmp_path / "other")],
      capture_output=True, text=True, cwd=REPO, env=user_environment(), timeout=600)
  assert completed.returncode == 0, completed.stderr[-4000:]
  line = next(text for text in completed.stdout.splitlines() if text.startswith("RESULTS "))
  results = json.loads(line[len("RESULTS "):])
  assert results["first"] == 20
  assert results["resumed"] == 40
  assert "Restored checkpoint at step 20" in completed.stderr  # resumed, not restarted
  assert results["again"] is True
  assert results["eval"] == 2000
  assert ("data.num_train_examples=256" in results["by_name"]
          and "data.num_train_examples=10000" in results["by_name"]), results["by_name"]
  assert results["by_path"] == 40
  assert results["export"].endswith("export/40")
  assert results["other"] == 10
  assert results["auto_resumed"] == 20
  assert "Restored checkpoint at step 10" in completed.stderr
  # The same line the CLI prints for the same bad value.
  cli = run_trainer(tmp_path / "cli_bad", "--config=synthetic", "--config.train.steps=-1")
  assert cli.error_lines() == [f"distloop: error: {results['error']}"]
  assert results["handlers_left"]  # the API installed no signal handler
  assert "Training mnist_cnn on synthetic" in completed.stderr  # logs visible by default
  # ... and only distloop's: orbax said ~12 INFO lines per checkpoint here (~280 a run).
  chatter = [line for line in completed.stderr.splitlines()
             if re.search(r"\[process=\d+\]|CheckpointManager|save_device_host|MemoryRegulated",
                          line)]
  assert not chatter, chatter[:5]
