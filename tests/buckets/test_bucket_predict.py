"""--mode=predict into a bucket (issue 58), on the emulators of tests/support/object_stores.py:
a gs:// or s3:// model_dir's own predictions/<step>/, or a predict.output URL, holds the
objects a local run writes (the same rows, the same bytes, every file); a SIGKILL at any
of five moments of the commit, then the same command, leaves exactly those objects; a
second --mode=predict on the same output is refused in one line while the first holds it.

Before issue 58 each command here was refused ("predictions are not yet written to a
bucket"): each test fails there. The reference is a local --mode=predict on a plain copy
of the bucket's model_dir (the same weights and run id: the same bytes, progress.json and
manifest.json included)."""
# pylint: disable=redefined-outer-name  (pytest fixtures)
import os
import signal
import time

import pytest

from tests.support.cli import REPO, run_trainer
from tests.support.processes import TrainerProcess

pytestmark = pytest.mark.slow

_STEP = 4
_TRAIN = ("--config=synthetic", "--config.model.conv_filters=4", "--config.model.dense_units=8",
          f"--config.train.steps={_STEP}", "--config.train.steps_per_loop=2",
          "--config.data.num_train_examples=128", "--config.data.num_eval_examples=400",
          "--config.train.global_batch_size=32")
# 400 eval rows in 4 chunks of 100; a short lease: a killed writer's is taken over in ~4 s.
_PREDICT = (*_TRAIN, "--mode=predict", "--config.predict.global_batch_size=50",
            "--config.predict.chunk_rows=100", "--config.checkpoint.lease_seconds=4")
_OUTPUT = f"predictions/{_STEP}"

# Where a SIGKILL lands: just before the writer puts this file in the bucket (written in
# its staging folder, not in the bucket yet: tests/support/before_put/).
_MOMENTS = {
    "before any chunk": "parquet/part-00000-of-00004.parquet",
    "a chunk's Parquet put, its records shard not": "records/train-00001-of-00004",
    "a chunk's files put, progress.json not naming them": "progress.json",
    "between two chunks": "parquet/part-00003-of-00004.parquet",
    "every chunk committed, the manifests not": "records/manifest.json",
}
_BEFORE_PUT = os.path.join(REPO, "tests", "support", "before_put")


def _ok(result) -> None:
  assert result.returncode == 0, f"exit {result.returncode}\n{result.stderr[-4000:]}"


def _env(store, tmp_path) -> dict:
  tmpdir = tmp_path / f"tmp-{time.monotonic_ns()}"
  tmpdir.mkdir()
  return {**store.env, "TMPDIR": str(tmpdir)}


def _local_files(directory) -> dict:
  """{relative path: bytes} of a local output, but its lock file (a bucket's is a lease,
  deleted when released)."""
  found = {}
  for parent, _, names in os.walk(directory):
    for name in names:
      path = os.path.join(parent, name)
      relative = os.path.relpath(path, directory).replace(os.sep, "/")
      if relative != ".lock":
        with open(path, "rb") as f:
          found[relative] = f.read()
  return found


def _objects(store, url: str) -> dict:
  return {name: store.read(f"{url}/{name}") for name in store.list(url)}


@pytest.fixture(scope="module")
def _runs():
  return {}


@pytest.fixture
def trained(object_store, _runs, tmp_path_factory):
  """(the bucket model_dir's URL, the reference output's files): 4 steps trained on a
  bucket, then predicted locally from a plain copy of it (one per module and store)."""
  if object_store.scheme not in _runs:
    url = object_store.new_url("run")
    tmp = tmp_path_factory.mktemp(f"predict-{object_store.scheme}")
    _ok(run_trainer(url, *_TRAIN, env=_env(object_store, tmp)))
    copy = tmp / "copy"
    for name in object_store.list(url):
      path = copy.joinpath(*name.split("/"))
      path.parent.mkdir(parents=True, exist_ok=True)
      path.write_bytes(object_store.read(f"{url}/{name}"))
    _ok(run_trainer(copy, *_PREDICT))
    reference = _local_files(copy / _OUTPUT)
    assert {"progress.json", "manifest.json", "records/manifest.json"} <= reference.keys()
    assert sum(name.startswith("parquet/") for name in reference) == 4, sorted(reference)
    _runs[object_store.scheme] = (url, reference)
  return _runs[object_store.scheme]


def test_predictions_in_a_bucket_are_the_bytes_of_a_local_run(object_store, trained, tmp_path):
  """Into the bucket model_dir's predictions/<step>/, and into a predict.output URL of
  another bucket: every object the local run's file, byte for byte, and no other (no
  lease, no temporary); the same command again is a no-op that says so; another source's
  predictions into it are refused in one line, the bucket untouched (what the bucket
  holds is read, not only the staging folder)."""
  url, reference = trained
  _ok(run_trainer(url, *_PREDICT, env=_env(object_store, tmp_path)))
  assert _objects(object_store, f"{url}/{_OUTPUT}") == reference
  output = object_store.new_url("scores")
  _ok(run_trainer(url, *_PREDICT, f"--config.predict.output={output}",
                  env=_env(object_store, tmp_path)))
  assert _objects(object_store, output) == reference
  again = run_trainer(url, *_PREDICT, f"--config.predict.output={output}",
                      env=_env(object_store, tmp_path))
  _ok(again)
  assert '"already_finished": true' in again.stdout, again.stdout
  other = run_trainer(url, *_PREDICT, f"--config.predict.output={output}",
                      "--config.predict.split=train", env=_env(object_store, tmp_path))
  assert other.returncode == 2 and "Traceback" not in other.stderr, other.stderr[-3000:]
  assert f"predict.output={output} holds the predictions of another source" in \
      other.error_lines()[-1], other.error_lines()[-1]
  assert _objects(object_store, output) == reference


def _stopped_before_put(store, model_dir: str, output: str, match: str, tmp_path, *,
                        then: str = "kill", wait: bool = True):
  """A --mode=predict of `model_dir` into `output` that stops just before it puts the
  file `match` names in the bucket (`then`: kill itself, or pause); `wait`: until killed."""
  # The repository after the hook's folder: sitecustomize imports trainer before `python -m`
  # puts the working directory first, and must import this checkout's, not an installed one.
  env = {**_env(store, tmp_path), "PYTHONPATH": os.pathsep.join([_BEFORE_PUT, REPO]),
         "DISTLOOP_TEST_BEFORE_PUT": match, "DISTLOOP_TEST_THEN": then}
  process = TrainerProcess(model_dir, *_PREDICT, f"--config.predict.output={output}", env=env)
  if wait:
    assert process.finish(timeout=300) == -signal.SIGKILL, process.output[-3000:]
  return process


def test_a_sigkill_at_each_moment_and_the_same_command_leave_the_bytes_of_a_local_run(
    object_store, trained, tmp_path):
  """Killed at each moment in turn (each rerun goes on from what the last one committed,
  and is killed at the next moment), then run to the end: the objects of an uninterrupted
  run. Catches a chunk's file never put in the bucket, the lease left there, a rerun
  that ignores what the bucket holds (it scores every row again)."""
  url, reference = trained
  output = object_store.new_url("killed")
  for moment, match in _MOMENTS.items():
    _stopped_before_put(object_store, url, output, match, tmp_path)
    assert ".lock" in object_store.list(output), f"{moment}: the lease is the killed one's"
  last = run_trainer(url, *_PREDICT, f"--config.predict.output={output}",
                     env=_env(object_store, tmp_path))
  _ok(last)
  assert '"rows_scored": 0' in last.stdout, last.stdout  # every chunk was committed
  assert _objects(object_store, output) == reference


def test_a_second_predict_on_the_same_bucket_output_is_refused(object_store, trained, tmp_path):
  """One writer per output: the second command exits 2 with one line naming the folder
  and the holder, while the first (paused before its second chunk) keeps its lease."""
  url, _ = trained
  output = object_store.new_url("shared")
  first = _stopped_before_put(object_store, url, output, "parquet/part-00001", tmp_path,
                              then="pause", wait=False)
  try:
    first.wait_for("test paused before putting", timeout=300)
    second = run_trainer(url, *_PREDICT, f"--config.predict.output={output}",
                         env=_env(object_store, tmp_path))
    assert second.returncode == 2, second.stderr[-3000:]
    assert "Traceback" not in second.stderr
    line = second.error_lines()[-1]
    assert (f"predict.output={output} is being written by another --mode=predict" in line
            and "pid" in line), line
    assert first.process.poll() is None, "the first writer was disturbed"
    assert [name for name in object_store.list(output) if name.startswith("parquet/")] == [
        "parquet/part-00000-of-00004.parquet"]
  finally:
    first.kill()
