"""The predictions folder (trainer/state/predictions.py) without a model: what a commit
makes permanent, what a rerun removes, what is refused. The CLI's end-to-end runs (stops,
kills, shapes) are tests/outputs/test_predict.py."""
import json

import numpy as np
import pytest

from trainer.errors import UserError
from trainer.state import predictions

_IDENTITY = {"model": "run-a", "checkpoint_step": 40,
             "source": {"data": "synthetic", "split": "eval", "rows": 5}}


def _columns(first: int, end: int) -> dict:
  rows = np.arange(first, end, dtype=np.int64)
  return {"index": rows, "probabilities": np.stack([rows * 0.5, rows * -1.0], 1).astype(np.float32),
          "label": rows % 2}


def _open(directory, identity=_IDENTITY, chunk_rows=2, writer=True):
  return predictions.open_output(str(directory), identity, num_rows=5, chunk_rows=chunk_rows,
                                 writer=writer)


def _files(directory) -> dict:
  return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*"))
          if p.is_file() and p.name != ".lock"}


def test_a_rerun_keeps_committed_chunks_and_redoes_the_rest(tmp_path):
  """Chunks 0 and 1 committed, chunk 2's files written but not named in progress.json (a
  kill between them): the rerun goes on from row 4, the leftover gone; the finished folder
  is the bytes of one uninterrupted writer, columns in their order (a progress.json that
  reorders them changed the records' label), and its records read back as a dataset."""
  import ml_collections  # pylint: disable=import-outside-toplevel
  from input_pipelines.records import records  # pylint: disable=import-outside-toplevel
  reference = tmp_path / "reference"
  output = _open(reference)
  for first in (0, 2, 4):
    output.commit(_columns(first, min(first + 2, 5)))
  output.finish({})
  output.close()

  interrupted = tmp_path / "out"
  output = _open(interrupted)
  output.commit(_columns(0, 2))
  output.commit(_columns(2, 4))
  output.close()
  progress = (interrupted / "progress.json").read_bytes()
  killed = _open(interrupted)
  killed.commit(_columns(4, 5))  # its files land, then the kill: progress.json as it was
  killed.close()
  (interrupted / "progress.json").write_bytes(progress)

  resumed = _open(interrupted)
  assert resumed.rows_done == 4 and len(resumed.chunks) == 2
  assert sorted(p.name for p in (interrupted / "parquet").iterdir()) == [
      "part-00000-of-00003.parquet", "part-00001-of-00003.parquet"]
  resumed.commit(_columns(4, 5))
  manifest = resumed.finish({})
  resumed.close()
  assert manifest["rows"] == 5 and list(manifest["columns"]) == ["index", "probabilities", "label"]
  ours, theirs = _files(interrupted), _files(reference)
  del ours["manifest.json"], theirs["manifest.json"]
  assert ours.keys() == theirs.keys() and ours == theirs, [k for k in ours if ours[k] != theirs.get(k)]
  train, _ = records.build(ml_collections.ConfigDict({"dir": str(interrupted / "records")}), 0)
  features, labels = train.assemble(train.read_leaves(np.arange(5)))
  np.testing.assert_array_equal(labels.numpy(), _columns(0, 5)["probabilities"])
  np.testing.assert_array_equal(features["index"].numpy(), np.arange(5))


def test_a_commit_checks_its_rows(tmp_path):
  """A chunk must be exactly its range of rows: a buffer off by one is an error, not a
  chunk of shifted rows."""
  output = _open(tmp_path / "out")
  with pytest.raises(AssertionError, match="not 0..1"):
    output.commit(_columns(1, 3))
  output.close()


@pytest.mark.parametrize("change, said", [
    ({"identity": {**_IDENTITY, "model": "run-b"}}, "another model"),
    ({"identity": {**_IDENTITY, "checkpoint_step": 30}}, "another checkpoint step"),
    ({"identity": {**_IDENTITY, "source": {**_IDENTITY["source"], "split": "train"}}},
     "another source"),
    ({"chunk_rows": 3}, "chunk_rows=2"),
])
def test_another_models_or_sources_folder_is_refused_untouched(tmp_path, change, said):
  output = _open(tmp_path / "out")
  output.commit(_columns(0, 2))
  output.close()
  before = _files(tmp_path / "out")
  with pytest.raises(UserError, match=said):
    _open(tmp_path / "out", **change)
  assert _files(tmp_path / "out") == before


def test_a_folder_of_other_files_and_a_second_writer_are_refused(tmp_path):
  foreign = tmp_path / "foreign"
  foreign.mkdir()
  (foreign / "notes.txt").write_text("mine")
  with pytest.raises(UserError, match="holds no predictions"):
    _open(foreign)
  assert [p.name for p in foreign.iterdir()] == ["notes.txt"]
  first = _open(tmp_path / "out")
  with pytest.raises(UserError, match="another --mode=predict"):
    _open(tmp_path / "out")
  first.close()
  _open(tmp_path / "out").close()  # released: the next run may write


def test_a_finished_folder_is_recognized_and_anothers_refused(tmp_path):
  output = _open(tmp_path / "out")
  for first in (0, 2, 4):
    output.commit(_columns(first, min(first + 2, 5)))
  output.finish({"seconds": 1.0})
  output.close()
  manifest = predictions.finished(str(tmp_path / "out"), _IDENTITY)
  assert manifest["rows"] == 5 and manifest["digest"] == output.digest()
  assert json.loads((tmp_path / "out" / "manifest.json").read_text())["model"] == "run-a"
  with pytest.raises(UserError, match="another model"):
    predictions.finished(str(tmp_path / "out"), {**_IDENTITY, "model": "run-b"})
  assert predictions.finished(str(tmp_path / "new"), _IDENTITY) is None
