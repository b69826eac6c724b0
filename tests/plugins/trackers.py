"""Users' trackers (runtime.loggers=tests.plugins.trackers:CLASS) for tests/outputs/test_trackers.py.

- `Recorder`: appends each call it gets, as a JSON line, to $DISTLOOP_TRACKER_CALLS.
- `FailsAtStep3`: raises in `write` at step 3 (training must go on, one warning).
- `Unreachable`: its `check` raises (the run is refused: one line, exit 2).
"""
import json
import os

import trainer


class Recorder(trainer.Reporter):

  def _note(self, *call) -> None:
    with open(os.environ["DISTLOOP_TRACKER_CALLS"], "a") as f:
      f.write(json.dumps(call) + "\n")

  def check(self):
    self._note("check")

  def start(self, config, model_dir):
    self._note("start", config["train"]["steps"], os.path.basename(model_dir))

  def rewind(self, step):
    self._note("rewind", step)

  def write(self, step, split, values):
    self._note("write", step, split, values)

  def finish(self, summary, export_dir):
    self._note("finish", summary["step"], os.path.basename(export_dir or ""))

  def close(self):
    self._note("close")


class FailsAtStep3(trainer.Reporter):

  def write(self, step, split, values):
    if step == 3:
      raise ConnectionError("the tracker's server went away")


class Unreachable(trainer.Reporter):

  def check(self):
    raise ConnectionError("no route to tracker.example.com")
