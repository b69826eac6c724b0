"""Converted data on disk (`data.name='records'`): reads back what was written, in the order
the same data has in memory; bad folders are one line (exit 2); converted Fashion-MNIST
trains to the weights of the IDX files in memory and to >= 0.88 in two epochs."""
import json
import os
import shutil

import ml_collections
import numpy as np
import pytest

from input_pipelines import batching
from input_pipelines.records import convert
from input_pipelines.records import convert_inputs
from input_pipelines.records import records
from input_pipelines.sources import ArraySource
from tests.support.cli import FASHION_MNIST_DIR, run_trainer, train_ok
from tests.support.processes import assert_same_state, checkpoint_arrays

_SPEC = {"pixels": {"encoding": "raw", "dtype": "uint8", "shape": [4, 4, 1], "cast": "float32",
                    "scale": 255},
         "extra": {"encoding": "float", "shape": [3]},
         "label": {"encoding": "int64", "shape": []}}


def _arrays(n, seed):
  rng = np.random.default_rng(seed)
  return {"pixels": rng.integers(0, 256, (n, 4, 4, 1), dtype=np.uint8),
          "extra": rng.standard_normal((n, 3)).astype(np.float32),
          "label": np.arange(n, dtype=np.int64)}


def write_records(directory, train, evaluation, shard_bytes=1 << 12, spec=None, label="label"):
  """Writes numpy columns {key: [N, ...]} as converted records (several shards)."""
  def split(columns):
    return len(columns[label]), lambda i: {k: v[i] for k, v in columns.items()}
  source = convert_inputs.from_examples(spec or _SPEC, label, {"train": split(train),
                                                               "eval": split(evaluation)},
                                        fingerprint="test")
  convert.convert(source, str(directory), shard_bytes=shard_bytes, show_progress=False)
  return directory


@pytest.fixture(scope="module")
def small(tmp_path_factory):
  train, evaluation = _arrays(257, 0), _arrays(50, 1)
  directory = write_records(tmp_path_factory.mktemp("small") / "records", train, evaluation)
  return directory, train, evaluation


def _build(directory):
  return records.build(ml_collections.ConfigDict({"dir": str(directory)}), 0)


def test_any_rows_read_back_as_written_across_shards(small):
  directory, train, _ = small
  manifest = json.loads((directory / "manifest.json").read_text())
  assert len(manifest["splits"]["train"]) > 3  # the rows below span several shards
  source, _ = _build(directory)
  assert len(source) == 257
  rows = np.array([256, 0, 17, 17, 130, 3, 255], np.int64)  # unsorted, repeated
  features, labels = source.assemble(source.read_leaves(rows))
  assert labels.numpy().tolist() == rows.tolist()
  np.testing.assert_array_equal(features["pixels"].numpy(), train["pixels"][rows] / np.float32(255))
  np.testing.assert_array_equal(features["extra"].numpy(), train["extra"][rows])


def test_training_order_is_the_one_of_the_same_arrays_in_memory(small):
  directory, train, _ = small
  on_disk, _ = _build(directory)
  in_memory = ArraySource({"pixels": train["pixels"], "extra": train["extra"]}, train["label"],
                          where="test")
  def labels(source, **kwargs):
    dataset = batching.train_dataset(source, seed=4, global_batch_size=40, start_example=33,
                                     **kwargs)
    return [batch[1].numpy().tolist() for batch in dataset.take(15)]  # crosses epochs
  assert labels(on_disk) == labels(in_memory)


def test_a_record_source_reads_only_the_rows_it_is_asked_for(small, tmp_path, monkeypatch):
  directory, _, _ = small
  monkeypatch.setenv("DISTLOOP_DEBUG_READS", str(tmp_path))
  from input_pipelines import read_log
  source, _ = _build(directory)
  dataset = batching.eval_dataset(source, global_batch_size=100)
  assert sum(len(b[1]) for b in dataset) == 257
  logged = read_log.load(str(tmp_path))
  assert sorted(logged["eval", "local"].tolist()) == list(range(257))


# Bad folders: one line, exit 2, nothing written -------------------------------------------

_IMAGES_SPEC = {"images": {"encoding": "raw", "dtype": "uint8", "shape": [28, 28, 1],
                           "cast": "float32", "scale": 255},
                "labels": {"encoding": "int64", "shape": []}}
_IMAGES_FLAGS = ["--config=mnist_cnn", "--config.data.name=records"]


@pytest.fixture(scope="module")
def images(tmp_path_factory):
  """MNIST-shaped random records (the seed CNN trains on them), in several shards."""
  def columns(n, seed):
    rng = np.random.default_rng(seed)
    return {"images": rng.integers(0, 256, (n, 28, 28, 1), dtype=np.uint8),
            "labels": rng.integers(0, 10, n, dtype=np.int64)}
  directory = tmp_path_factory.mktemp("images") / "records"
  return write_records(directory, columns(600, 0), columns(100, 1), shard_bytes=1 << 17,
                       spec=_IMAGES_SPEC, label="labels")


def _damaged(images, tmp_path, damage):
  directory = tmp_path / "damaged"
  shutil.copytree(images, directory)
  damage(directory)
  return directory


def _rewrite_manifest(change):
  def damage(directory):
    manifest = json.loads((directory / "manifest.json").read_text())
    change(manifest)
    (directory / "manifest.json").write_text(json.dumps(manifest))
  return damage


def _truncate_first_shard(directory):
  path = directory / json.loads((directory / "manifest.json").read_text())[
      "splits"]["train"][0]["file"]
  path.write_bytes(path.read_bytes()[:-100])


def _truncate_and_fix_size(directory):
  """A shard cut short whose manifest size was edited to match: its own index is gone."""
  manifest = json.loads((directory / "manifest.json").read_text())
  shard = manifest["splits"]["train"][0]
  path = directory / shard["file"]
  path.write_bytes(path.read_bytes()[:-100])
  shard["bytes"] = path.stat().st_size
  (directory / "manifest.json").write_text(json.dumps(manifest))


BAD_FOLDERS = {
    "missing manifest (the index)": (lambda d: (d / "manifest.json").unlink(), "manifest.json: missing"),
    "manifest not JSON": (lambda d: (d / "manifest.json").write_text("{"), "not readable JSON"),
    "shard missing": (lambda d: next(d.glob("eval-*")).unlink(), "missing"),
    "shard truncated": (_truncate_first_shard, "does not match its manifest"),
    "shard index gone": (_truncate_and_fix_size, "cannot open the shard"),
    "record count differs": (_rewrite_manifest(
        lambda m: m["splits"]["eval"][0].update(num_records=7)), "does not match its manifest"),
    "spec does not fit": (_rewrite_manifest(
        lambda m: m["features"]["images"].update(shape=[27, 28, 1])), "does not fit"),
    "label not in spec": (_rewrite_manifest(lambda m: m.update(label="nope")), "'nope'"),
}


@pytest.mark.parametrize("case", sorted(BAD_FOLDERS))
def test_bad_folder_is_one_line_and_exit_2(images, tmp_path, case):
  damage, expected = BAD_FOLDERS[case]
  directory = _damaged(images, tmp_path, damage)
  model_dir = tmp_path / "run"
  result = run_trainer(model_dir, *_IMAGES_FLAGS, f"--config.data.dir={directory}", timeout=120)
  assert result.returncode == 2, result.stderr[-2000:]
  lines = result.error_lines()
  assert len(lines) == 1 and lines[0].startswith("distloop: error:"), result.stderr[-2000:]
  assert expected in lines[0]
  assert not model_dir.exists()


def test_corrupt_bytes_inside_a_shard_are_named_when_read(images, tmp_path):
  """Same size, same count: found by the record hashes when the record is read (exit 2)."""
  def flip(directory):
    for path in directory.glob("train-*"):
      data = bytearray(path.read_bytes())
      for offset in range(len(data) // 4, len(data) // 2, 97):  # records, not the index
        data[offset] ^= 0x5A
      path.write_bytes(bytes(data))
  directory = _damaged(images, tmp_path, flip)
  # TensorFlow's import set TF_CPP_MIN_LOG_LEVEL=1 in this process: give the child the
  # default a user has (its kernels' own warnings hidden).
  result = run_trainer(tmp_path / "run", *_IMAGES_FLAGS, f"--config.data.dir={directory}",
                       "--config.train.steps=20", timeout=300, env={"TF_CPP_MIN_LOG_LEVEL": "3"})
  assert result.returncode == 2, result.stderr[-2000:]
  line = result.error_lines()[-1]
  assert line.startswith("distloop: error:") and "cannot read records" in line
  assert "Traceback" not in result.stderr


# Fashion-MNIST: converted == in memory ---------------------------------------------------

_DETERMINISTIC = ["--config=mnist_cnn", "--config.runtime.deterministic=true"]


@pytest.fixture(scope="module")
def fashion_records(tmp_path_factory):
  output = tmp_path_factory.mktemp("fashion") / "records"
  source = convert_inputs.idx(FASHION_MNIST_DIR, convert_inputs.Options())
  convert.convert(source, str(output), shard_bytes=8 << 20, show_progress=False)
  return output


@pytest.fixture(scope="module")
def fashion_two_epochs(fashion_records, tmp_path_factory):
  """Two epochs from the converted files, keeping step 200's checkpoint."""
  model_dir = tmp_path_factory.mktemp("fashion_records_run")
  summary = train_ok(model_dir, *_DETERMINISTIC, "--config.data.name=records",
                     f"--config.data.dir={fashion_records}", "--config.checkpoint.interval=200",
                     "--config.checkpoint.keep_period=200")
  return model_dir, summary


@pytest.mark.slow
def test_converted_fashion_mnist_is_several_shards(fashion_records):
  manifest = json.loads((fashion_records / "manifest.json").read_text())
  assert len(manifest["splits"]["train"]) >= 4
  assert sum(s["num_records"] for s in manifest["splits"]["train"]) == 60_000
  assert sum(s["num_records"] for s in manifest["splits"]["eval"]) == 10_000


@pytest.mark.slow
def test_same_weights_as_the_idx_files_in_memory_after_200_steps(fashion_two_epochs, tmp_path):
  model_dir, _ = fashion_two_epochs
  train_ok(tmp_path, *_DETERMINISTIC, "--config.data.name=fashion_mnist",
           f"--config.data.dir={FASHION_MNIST_DIR}", "--config.train.steps=200")
  in_memory = checkpoint_arrays(tmp_path, 200)
  assert_same_state(checkpoint_arrays(model_dir, 200), in_memory, atol=1e-6)


@pytest.mark.slow
def test_two_epochs_from_disk_reach_088_and_export_images(fashion_two_epochs):
  model_dir, summary = fashion_two_epochs
  assert summary["step"] == 1875 and summary["eval_examples"] == 10_000
  assert summary["eval_accuracy"] >= 0.88
  assert os.path.isdir(os.path.join(model_dir, "export", "1875"))
