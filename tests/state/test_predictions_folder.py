"""The predictions folder (trainer/state/predictions.py) without a model: what a commit
makes permanent, what a rerun removes, what is refused. The CLI's end-to-end runs (stops,
kills, shapes) are tests/outputs/test_predict.py."""
import json
import os
import shutil

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


def _inputs(first: int, end: int) -> str:
  """The input rows' digest of a source that never changes."""
  return f"rows {first}..{end}"


def _open(directory, identity=_IDENTITY, chunk_rows=2, writer=True, inputs=_inputs):
  return predictions.open_output(str(directory), identity, num_rows=5, chunk_rows=chunk_rows,
                                 writer=writer, inputs=inputs)


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
  output.finish()
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
  manifest = resumed.finish()
  resumed.close()
  assert manifest["rows"] == 5 and list(manifest["columns"]) == ["index", "probabilities", "label"]
  ours, theirs = _files(interrupted), _files(reference)  # every file, the manifests too
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
  output.finish()
  output.close()
  manifest = predictions.finished(str(tmp_path / "out"), _IDENTITY, _inputs)
  assert manifest["rows"] == 5 and manifest["digest"] == output.digest()
  assert json.loads((tmp_path / "out" / "manifest.json").read_text())["model"] == "run-a"
  with pytest.raises(UserError, match="another model"):
    predictions.finished(str(tmp_path / "out"), {**_IDENTITY, "model": "run-b"}, _inputs)
  assert predictions.finished(str(tmp_path / "new"), _IDENTITY, _inputs) is None


def _finished(directory, stop_before: int | None = None):
  """A folder of the 3 chunks written by one writer; `stop_before`: the chunk it stops
  before (its earlier chunks committed, no manifest)."""
  output = _open(directory)
  for index, first in enumerate((0, 2, 4)):
    if index == stop_before:
      break
    output.commit(_columns(first, min(first + 2, 5)))
  else:
    output.finish()
  output.close()


def _committed_files_are_whole(directory) -> list[str]:
  """What progress.json names that is not the bytes it recorded: [] on a sound folder."""
  import hashlib  # pylint: disable=import-outside-toplevel
  chunks = json.loads((directory / "progress.json").read_text())["chunks"]
  return [entry["file"] for chunk in chunks for sub, entry in (("parquet", chunk["parquet"]),
                                                              ("records", chunk["records"]))
          if not (directory / sub / entry["file"]).is_file()
          or hashlib.sha256((directory / sub / entry["file"]).read_bytes()).hexdigest()
          != entry["sha256"]]


class _Killed(BaseException):
  """A kill, in-process: no handler of distloop's catches it."""


@pytest.mark.parametrize("renames_done", [0, 1, 2, 3])
def test_a_kill_inside_the_commit_window_leaves_no_chunk_named_before_its_files(
    tmp_path, monkeypatch, renames_done):
  """A fault injected at each point of chunk 1's commit (after 0..3 of its renames: the
  records shard, the Parquet file, progress.json): every chunk progress.json names has
  its files whole, and the rerun (no damage to warn of) ends with the bytes of one
  uninterrupted writer, every file. progress.json naming a chunk before its Parquet is
  renamed into place fails here (renames_done=2: progress.json renamed, the Parquet file
  not)."""
  reference, output_dir = tmp_path / "reference", tmp_path / "out"
  _finished(reference)
  _finished(output_dir, stop_before=1)
  replace, calls = os.replace, []

  def faulty(source, destination):
    if len(calls) == renames_done:
      raise _Killed(f"killed after {renames_done} rename(s)")
    calls.append(destination)
    replace(source, destination)
    if len(calls) == renames_done == 3:
      raise _Killed("killed after the commit")

  output = _open(output_dir)
  monkeypatch.setattr(os, "replace", faulty)
  with pytest.raises(_Killed):
    output.commit(_columns(2, 4))
  monkeypatch.setattr(os, "replace", replace)
  output.close()
  assert _committed_files_are_whole(output_dir) == [], calls

  warned = []
  monkeypatch.setattr(predictions.logging, "warning", lambda *args: warned.append(args))
  resumed = _open(output_dir)
  assert warned == [] and len(resumed.chunks) == (1 if renames_done < 3 else 2)
  for first in (0, 2, 4)[len(resumed.chunks):]:
    resumed.commit(_columns(first, min(first + 2, 5)))
  resumed.finish()
  resumed.close()
  assert _files(output_dir) == _files(reference)


def _other_inputs(first: int, end: int) -> str:
  """The digest after rows 2..3 of the source were rewritten (the same count)."""
  return _inputs(first, end) + (" rewritten" if first <= 3 and end > 2 else "")


@pytest.mark.parametrize("stop_before", [2, None])
def test_chunks_scored_on_other_input_rows_are_refused_untouched(tmp_path, stop_before):
  """The source's rows 2..3 rewritten (same count) after chunks 0 and 1 were committed
  (stopped, or finished): the rerun is refused in one line naming chunk 1 and its rows,
  nothing changed, never a mix of the old data's chunks and the new's."""
  _finished(tmp_path / "out", stop_before=stop_before)
  before = _files(tmp_path / "out")
  with pytest.raises(UserError, match=r"chunk 1 \(rows 2\.\.3\) was scored on other input"):
    if stop_before is None:
      predictions.finished(str(tmp_path / "out"), _IDENTITY, _other_inputs)
    else:
      _open(tmp_path / "out", inputs=_other_inputs)
  assert _files(tmp_path / "out") == before


@pytest.mark.parametrize("stop_before", [2, None])
@pytest.mark.parametrize("damage", ["truncated", "removed"])
def test_a_damaged_committed_chunk_is_scored_again_with_a_warning(tmp_path, monkeypatch,
                                                                   stop_before, damage):
  """Chunk 0's Parquet file or chunk 1's records shard truncated to half or removed, in a
  stopped or a finished folder: the rerun warns once naming the chunk and the file, is
  not finished, goes on from that chunk, and ends with the bytes of one uninterrupted
  writer. A rerun that keeps what progress.json names without checking it fails here."""
  reference = tmp_path / "reference"
  _finished(reference)
  output_dir = tmp_path / "out"
  _finished(output_dir, stop_before=stop_before)
  for index, file in enumerate((next((output_dir / "parquet").glob("part-00000-*")),
                                next((output_dir / "records").glob("train-00001-*")))):
    damaged = tmp_path / f"damaged{index}"
    shutil.copytree(output_dir, damaged)
    path = damaged / file.relative_to(output_dir)
    if damage == "removed":
      path.unlink()
    else:
      path.write_bytes(path.read_bytes()[:path.stat().st_size // 2])
    assert predictions.finished(str(damaged), _IDENTITY, _inputs) is None
    warned = []
    monkeypatch.setattr(predictions.logging, "warning",
                        lambda message, *args, said=warned: said.append(message % args))
    resumed = _open(damaged)
    assert len(warned) == 1 and f"{path.parent.name}/{path.name} of chunk {index}" in warned[0]
    assert len(resumed.chunks) == index and not (damaged / "manifest.json").exists()
    for first in (0, 2, 4)[index:]:
      resumed.commit(_columns(first, min(first + 2, 5)))
    resumed.finish()
    resumed.close()
    assert _files(damaged) == _files(reference), damaged
