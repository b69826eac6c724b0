"""One index of the checkpoint steps (issue 58): the resume's checks (the config, the run id,
the shape, the newest data position) read each step's meta once per process, through
`model_dir.steps_with_meta`, and read it again only when the file changed (a step set
aside and saved anew)."""
import json
import os

from trainer.store import files
from trainer.store import model_dir as layout


def _step(model_dir, step: int, meta: dict) -> None:
  path = os.path.join(layout.checkpoint_dir(model_dir), str(step), "meta", "metadata")
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "w", encoding="utf-8") as f:
    json.dump(meta, f)


def test_each_meta_is_read_once_newest_first_and_again_once_changed(tmp_path, monkeypatch):
  model_dir = str(tmp_path)
  _step(model_dir, 10, {"examples_consumed": 320})
  _step(model_dir, 20, {"examples_consumed": 640})
  os.makedirs(os.path.join(layout.checkpoint_dir(model_dir), "30.orbax-checkpoint-tmp-1"))
  reads = []
  read_json = files.read_json
  monkeypatch.setattr(files, "read_json", lambda path: reads.append(path) or read_json(path))

  assert layout.steps_with_meta(model_dir) == [(20, {"examples_consumed": 640}),
                                                (10, {"examples_consumed": 320})]
  assert layout.newest_data_position(model_dir) == (20, 640)
  assert layout.newest_data_position(model_dir, at_most=15) == (10, 320)
  assert len(reads) == 2  # one read of each step's meta, whoever asked

  layout.steps_with_meta(model_dir)[0][1]["examples_consumed"] = -1  # the caller's copy
  assert layout.newest_data_position(model_dir) == (20, 640)

  _step(model_dir, 20, {"examples_consumed": 6400})  # set aside and saved anew
  assert layout.newest_data_position(model_dir) == (20, 6400)
  assert len(reads) == 3
