"""A signal during start-up ends the run within seconds, exit 42 with one line and no
traceback, even when a config's get_config, a data or a model builder blocks forever
(the handler used to only set a flag, read once start-up was over: never). The model
builder runs under the writer lock: a fresh model_dir is left as a refused run leaves it."""
import os
import signal
import time

import pytest

from tests.support.cli import REPO
from tests.support.processes import TrainerProcess

_HUNG = os.path.join(REPO, "tests", "plugins", "hung_plugins.py")
_QUICK = ["--config.train.steps=4", "--config.train.steps_per_loop=2",
          "--config.data.num_train_examples=256", "--config.data.num_eval_examples=64"]
_WITHIN_SECONDS = 10


@pytest.mark.parametrize("flags, where", [
    ([f"--config={_HUNG}"], "get_config"),
    (["--config=synthetic", f"--config.data.name={_HUNG}:data"], "data"),
    (["--config=synthetic", f"--config.model.name={_HUNG}:model"], "model"),
    (["--config=synthetic", f"--config.model.name={_HUNG}:stubborn_model"], "stubborn_model"),
], ids=["get_config", "data-builder", "model-builder", "stuck-model-builder"])
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_ends_a_hung_start_up_in_seconds(tmp_path, flags, where, signum):
  model_dir = tmp_path / "model_dir"
  process = TrainerProcess(model_dir, *flags, *_QUICK)
  try:
    process.wait_for(rf"hung plug-in: {where}$", timeout=60)
    after = len(process.lines)
    process.send(signum)
    signalled = time.monotonic()
    code = process.wait(timeout=_WITHIN_SECONDS + 20)
    took = time.monotonic() - signalled
  finally:
    process.kill()
  assert code == 42, process.output[-3000:]
  assert took < _WITHIN_SECONDS, f"{took:.1f} s\n{process.output[-3000:]}"
  assert "Traceback" not in process.output, process.output[-3000:]
  said = [line for line in process.lines[after:] if line.strip()]
  assert len(said) == 1, process.output[-3000:]
  assert f"preempted during start-up ({signal.Signals(signum).name}), before training" in said[0]
  assert not model_dir.exists()  # nothing written, the lock file included
