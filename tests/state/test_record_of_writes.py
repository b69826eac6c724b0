"""Every byte under a model_dir went through the store (issue 58): a run of every mode (train
and eval with a profile and the best checkpoints kept, a SIGTERM and its resume, eval,
predict, export), on a local model_dir and on a gs:// one, with the store's own record of
writes on (DISTLOOP_STORE_RECORD, trainer/store/record.py); then each file left in model_dir,
and each object left in the bucket, must be one the store wrote, committed, fetched, locked,
or handed to a library (orbax, TensorBoard, the profiler) in a folder of its own.

What it catches that the static rule of tests/docs/test_layout.py cannot see: a write by any
other means (`tf.io.gfile`, a library's own save, numpy, a writer opened on a path the store
never handed out), a library writing outside the folder it was given, an object put in the
bucket from a file the store never wrote.
"""
# pylint: disable=redefined-outer-name  (pytest fixtures)
import json
import os
import re

import pytest

from tests.support.processes import TrainerProcess

_FLAGS = ("--config=synthetic", "--config.model.conv_filters=4", "--config.model.dense_units=8",
          "--config.train.steps=30", "--config.train.steps_per_loop=5",
          "--config.checkpoint.interval=10", "--config.eval.interval=10",
          "--config.checkpoint.keep_best=1", "--config.runtime.profile_steps=2,4",
          "--config.data.num_train_examples=320", "--config.data.num_eval_examples=64",
          "--config.train.global_batch_size=32", "--config.predict.global_batch_size=32")
# What each library writes in the folder the store handed it, relative to that folder.
_LIBRARY_FILES = {"orbax": r"\d+/.+", "TensorBoard": r"events\.out\.tfevents\.[^/]+",
                  "profiler": r"[^/]+/[^/]+"}
_AT_FILE = ("written", "appended", "published", "fetched", "lock", "committed", "moved")


def _entries(record: str) -> list[dict]:
  with open(record, encoding="utf-8") as f:
    return [json.loads(line) for line in f]


def _written_by_the_store(path: str, entries: list[dict]) -> bool:
  """Whether the record accounts for the file `path` (a local path or a URL)."""
  for entry in entries:
    if entry["how"] == "put":
      continue
    if not entry["folder"]:
      if entry["path"] == path and entry["how"] in _AT_FILE:
        return True
    elif path.startswith(entry["path"] + "/"):
      library = entry.get("library")
      relative = path[len(entry["path"]) + 1:]
      if library is None or re.fullmatch(_LIBRARY_FILES[library], relative):
        return True
  return False


def _put_by_the_store(url: str, entries: list[dict]) -> bool:
  """Whether the record has `url` put in the bucket, from a file the store wrote (or made
  by the store itself: a commit marker's listing, the lease)."""
  for entry in entries:
    if entry["how"] == "put" and entry["path"] == url:
      source = entry.get("source")
      if source is None or _written_by_the_store(source, entries):
        return True
  return False


def _files(model_dir: str) -> list[str]:
  return sorted(os.path.join(parent, name) for parent, _, names in os.walk(model_dir)
                for name in names)


def _run_every_mode(model_dir: str, env: dict) -> None:
  """train_and_eval stopped by SIGTERM at step 15, resumed to 30; then eval, predict and
  export. Each must end as it does without the record."""
  first = TrainerProcess(model_dir, *_FLAGS, "--mode=train_and_eval", env=env)
  assert first.stop_at(r"step 15/30") == 42, first.output[-3000:]
  for mode in ("train_and_eval", "eval", "predict", "export"):
    process = TrainerProcess(model_dir, *_FLAGS, f"--mode={mode}", env=env)
    assert process.finish() == 0, f"{mode}:\n{process.output[-3000:]}"


def test_the_record_catches_a_file_written_around_the_store(tmp_path):
  """The audit itself can fail: a file nobody recorded, a library's file outside its
  pattern, an object put from an unrecorded file are each named."""
  model_dir = str(tmp_path / "run")
  entries = [{"path": f"{model_dir}/config.json", "how": "written", "folder": False},
             {"path": f"{model_dir}/tensorboard/train", "how": "library", "folder": True,
              "library": "TensorBoard"},
             {"path": "gs://b/run/config.json", "how": "put", "folder": False,
              "source": f"{model_dir}/config.json"},
             {"path": "gs://b/run/notes.txt", "how": "put", "folder": False,
              "source": f"{model_dir}/notes.txt"}]
  assert _written_by_the_store(f"{model_dir}/config.json", entries)
  assert not _written_by_the_store(f"{model_dir}/notes.txt", entries)
  assert _written_by_the_store(f"{model_dir}/tensorboard/train/events.out.tfevents.1.h", entries)
  assert not _written_by_the_store(f"{model_dir}/tensorboard/train/notes.txt", entries)
  assert _put_by_the_store("gs://b/run/config.json", entries)
  assert not _put_by_the_store("gs://b/run/notes.txt", entries)


@pytest.mark.slow
def test_every_file_of_a_local_model_dir_was_written_by_the_store(tmp_path):
  model_dir = str(tmp_path / "run")
  record = str(tmp_path / "record.jsonl")
  _run_every_mode(model_dir, {"DISTLOOP_STORE_RECORD": record})
  entries = _entries(record)
  files = _files(model_dir)
  assert any("/checkpoints_best/" in path for path in files), files  # each kind was written
  assert any("/plugins/profile/" in path for path in files), files
  assert any("/predictions/" in path for path in files), files
  assert [path for path in files if not _written_by_the_store(path, entries)] == []


@pytest.mark.slow
def test_every_object_of_a_bucket_model_dir_was_put_by_the_store(gcs_store, tmp_path):
  url = gcs_store.new_url("run")
  record = str(tmp_path / "record.jsonl")
  os.makedirs(tmp_path / "tmp")
  _run_every_mode(url, {**gcs_store.env, "TMPDIR": str(tmp_path / "tmp"),
                        "DISTLOOP_STORE_RECORD": record})
  entries = _entries(record)
  objects = [f"{url}/{name}" for name in gcs_store.list(url)]
  assert any("/checkpoints_best/" in name for name in objects), objects
  assert any("/predictions/" in name for name in objects), objects
  assert any("/export/" in name for name in objects), objects
  assert [name for name in objects if not _put_by_the_store(name, entries)] == []
