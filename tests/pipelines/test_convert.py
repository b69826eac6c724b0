"""`python -m input_pipelines.convert`: every input format, verification, resume after an
interruption, and bad input as one line (exit 2) with nothing left behind."""
import json
import os
import signal
import subprocess
import sys
import time

import ml_collections
import numpy as np
import pytest
from PIL import Image

from input_pipelines.records import convert
from input_pipelines.records import convert_inputs
from input_pipelines.records import records
from input_pipelines.errors import DataError
from tests.support.cli import REPO


def run_convert(*flags, timeout=300):
  # Importing TensorFlow here set TF_CPP_MIN_LOG_LEVEL=1: give the converter a user's default.
  env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
  return subprocess.run([sys.executable, "-m", "input_pipelines.convert", *flags], cwd=REPO,
                        capture_output=True, text=True, timeout=timeout, env=env)


def _one_error_line(result, expected):
  assert result.returncode == 2, result.stderr[-2000:]
  lines = [line for line in result.stderr.splitlines() if line.strip()]
  assert len(lines) == 1 and lines[0].startswith("distloop: error:"), result.stderr[-2000:]
  assert expected in lines[0]


def _read_all(directory, split_index=0):
  """(features, labels) of every record of a split, through data.name='records'."""
  source = records.build(ml_collections.ConfigDict({"dir": str(directory)}), 0)[split_index]
  return source.assemble(source.read_leaves(np.arange(len(source))))


def _mnist_npz(path, n_train, n_test=30, seed=0):
  rng = np.random.default_rng(seed)
  np.savez(path, x_train=rng.integers(0, 256, (n_train, 28, 28), dtype=np.uint8),
           y_train=rng.integers(0, 10, n_train), x_test=rng.integers(0, 256, (n_test, 28, 28),
                                                                       dtype=np.uint8),
           y_test=rng.integers(0, 10, n_test))
  return path


def test_npz_converts_checks_and_reruns_as_a_no_op(tmp_path):
  npz = _mnist_npz(tmp_path / "mnist.npz", 500)
  output = tmp_path / "out"
  result = run_convert("--from=npz", f"--input={npz}", f"--output={output}", "--shard_mb=1")
  assert result.returncode == 0, result.stderr[-2000:]
  assert "500 train and 30 eval records" in result.stdout and "records/s" in result.stdout
  assert "converting" in result.stderr and "rec/s" in result.stderr  # the progress bar
  manifest = json.loads((output / "manifest.json").read_text())
  assert manifest["metadata"]["from"] == "npz" and not (output / "progress.json").exists()
  images, labels = _read_all(output)
  with np.load(npz) as f:
    np.testing.assert_array_equal(images.numpy()[..., 0], f["x_train"] / np.float32(255))
    np.testing.assert_array_equal(labels.numpy(), f["y_train"])
  verified = run_convert(f"--verify={output}")
  assert verified.returncode == 0 and "every SHA-256 matches" in verified.stdout
  again = run_convert("--from=npz", f"--input={npz}", f"--output={output}")
  assert again.returncode == 0 and "Already converted" in again.stdout


def _convert(fmt, path, output, **options):
  """The converter as a library (the CLI's own tests are above and below)."""
  source = convert_inputs.FORMATS[fmt](str(path), convert_inputs.Options(**options))
  convert.convert(source, str(output), show_progress=False)
  return json.loads((output / "manifest.json").read_text())


def test_csv_keeps_the_tables_rows_and_columns(tmp_path):
  rng = np.random.default_rng(1)
  table = np.column_stack([rng.standard_normal((40, 3)), rng.integers(0, 2, 40)])
  folder = tmp_path / "table"
  folder.mkdir()
  for name, rows in (("train.csv", table[:30]), ("test.csv", table[30:])):
    lines = ["a,b,label,c"] + [f"{r[0]},{r[1]},{int(r[3])},{r[2]}" for r in rows]
    (folder / name).write_text("\n".join(lines) + "\n")
  manifest = _convert("csv", folder, tmp_path / "out")
  assert manifest["metadata"]["feature_columns"] == ["a", "b", "c"]
  features, labels = _read_all(tmp_path / "out", split_index=1)
  np.testing.assert_allclose(features.numpy(), table[30:, :3].astype(np.float32))
  np.testing.assert_array_equal(labels.numpy(), table[30:, 3].astype(np.float32))


def _image_folder(root, sizes=((40, 30), (32, 32))):
  for split in ("train", "test"):
    for label, colour in (("cat", (255, 0, 0)), ("dog", (0, 0, 255))):
      os.makedirs(root / split / label)
      for i, size in enumerate(sizes):
        Image.new("RGB", size, colour).save(root / split / label / f"{i}.png")
  return root


def test_image_folder_stores_encoded_files_decoded_when_read(tmp_path):
  folder = _image_folder(tmp_path / "images")
  manifest = _convert("image_folder", folder, tmp_path / "out", image_size=16)
  assert manifest["metadata"]["classes"] == ["cat", "dog"]
  assert manifest["features"]["images"]["encoding"] == "image"
  images, labels = _read_all(tmp_path / "out")
  assert images.shape == (4, 16, 16, 3) and images.dtype.name == "float32"
  assert labels.numpy().tolist() == [0, 0, 1, 1]
  np.testing.assert_allclose(images.numpy()[0], np.broadcast_to([1.0, 0.0, 0.0], (16, 16, 3)))
  np.testing.assert_allclose(images.numpy()[3], np.broadcast_to([0.0, 0.0, 1.0], (16, 16, 3)))


def test_a_broken_image_is_named_and_nothing_is_left_behind(tmp_path):
  folder = _image_folder(tmp_path / "images")
  (folder / "train" / "dog" / "1.png").write_bytes(b"\x89PNG\r\n\x1a\n broken")
  with pytest.raises(DataError, match="1.png: cannot be decoded"):
    _convert("image_folder", folder, tmp_path / "out", image_size=16)
  assert not (tmp_path / "out").exists()


_TF_SPEC = {"pixels": {"encoding": "raw", "dtype": "uint8", "shape": [2, 3]},
            "label": {"encoding": "int64", "shape": []}}


def _tfrecords(path, n, seed):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(seed)
  serialized = []
  with tf.io.TFRecordWriter(str(path)) as writer:
    for i in range(n):
      example = tf.train.Example(features=tf.train.Features(feature={
          "pixels": tf.train.Feature(bytes_list=tf.train.BytesList(
              value=[rng.integers(0, 256, 6, dtype=np.uint8).tobytes()])),
          "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[i])),
          "note": tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"kept as is"]))}))
      serialized.append(example.SerializeToString())
      writer.write(serialized[-1])
  return serialized


def test_tfrecord_examples_are_copied_byte_for_byte(tmp_path):
  train = _tfrecords(tmp_path / "train-0.tfrecord", 70, 0)
  train += _tfrecords(tmp_path / "train-1.tfrecord", 30, 1)
  _tfrecords(tmp_path / "eval.tfrecord", 10, 2)
  _convert("tfrecord", f"{tmp_path}/train-*.tfrecord", tmp_path / "out",
           eval_input=f"{tmp_path}/eval.tfrecord", features=json.dumps(_TF_SPEC))
  source = records.build(ml_collections.ConfigDict({"dir": str(tmp_path / "out")}), 0)[0]
  assert list(source.read_leaves(np.arange(100))[0]) == train
  pixels, labels = source.assemble(source.read_leaves(np.array([5, 80])))
  assert pixels.shape == (2, 2, 3) and labels.numpy().tolist() == [5, 10]  # 80: file 2's 10th


def test_tfrecord_that_does_not_fit_the_spec_is_one_line(tmp_path):
  _tfrecords(tmp_path / "train.tfrecord", 20, 0)
  spec = dict(_TF_SPEC, pixels={"encoding": "raw", "dtype": "uint8", "shape": [4, 4]})
  output = tmp_path / "out"
  result = run_convert("--from=tfrecord", f"--input={tmp_path}/train.tfrecord",
                       f"--eval_input={tmp_path}/train.tfrecord", f"--features={json.dumps(spec)}",
                       f"--output={output}")
  _one_error_line(result, "do not fit --features")
  assert not output.exists()


@pytest.mark.parametrize("flags, expected", [
    (["--from=idx", "--input=/no/such/folder"], "/no/such/folder"),
    (["--from=npz", "--input=/no/such.npz"], "--from=npz takes an .npz file"),
    (["--from=csv", "--input=/no/such.csv"], "no such file"),
    (["--from=tfrecord", "--input=/no/such"], "needs --features"),
    (["--from=tfrecord", "--input=/no/such", "--eval_input=/no/e",
      "--features={\"x\": {\"encoding\": \"raw\", \"shape\": [1]}, \"label\": {\"encoding\": "
      "\"int64\", \"shape\": []}}"], "needs a dtype"),
    (["--from=webdataset", "--input=x"], "--from"),
    (["--input=x"], "--from is required"),
])
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, flags, expected):
  output = tmp_path / "out"
  _one_error_line(run_convert(*flags, f"--output={output}", timeout=120), expected)
  assert not output.exists()


@pytest.mark.slow  # three conversions (the fast suite's time)
def test_an_output_folder_of_something_else_is_refused(tmp_path):
  npz = _mnist_npz(tmp_path / "mnist.npz", 50)
  (tmp_path / "busy").mkdir()
  (tmp_path / "busy" / "notes.txt").write_text("mine")
  _one_error_line(run_convert("--from=npz", f"--input={npz}", f"--output={tmp_path / 'busy'}"),
                  "not empty")
  done = tmp_path / "done"
  assert run_convert("--from=npz", f"--input={npz}", f"--output={done}").returncode == 0
  other = _mnist_npz(tmp_path / "other.npz", 60, seed=1)
  _one_error_line(run_convert("--from=npz", f"--input={other}", f"--output={done}"),
                  "another input")


def test_verify_names_a_corrupt_shard(tmp_path):
  npz = _mnist_npz(tmp_path / "mnist.npz", 300)
  output = tmp_path / "out"
  assert run_convert("--from=npz", f"--input={npz}", f"--output={output}").returncode == 0
  shard = next(output.glob("train-*"))
  data = bytearray(shard.read_bytes())
  data[len(data) // 2] ^= 0xFF
  shard.write_bytes(bytes(data))
  _one_error_line(run_convert(f"--verify={output}"), "SHA-256 differs")


@pytest.fixture(scope="module")
def big_npz(tmp_path_factory):
  """Enough records for many 1 MB shards: an interruption lands mid-conversion."""
  folder = tmp_path_factory.mktemp("big")
  npz = _mnist_npz(folder / "mnist.npz", 40_000)
  reference = folder / "reference"
  result = run_convert("--from=npz", f"--input={npz}", f"--output={reference}", "--shard_mb=1")
  assert result.returncode == 0, result.stderr[-2000:]
  return npz, json.loads((reference / "manifest.json").read_text())


def _start_and_stop_midway(npz, output, signum):
  env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
  process = subprocess.Popen([sys.executable, "-m", "input_pipelines.convert", "--from=npz",
                              f"--input={npz}", f"--output={output}", "--shard_mb=1"],
                             cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=env)
  progress = output / "progress.json"
  deadline = time.monotonic() + 240
  while not progress.exists() and process.poll() is None and time.monotonic() < deadline:
    time.sleep(0.02)  # a shard is done: the conversion is under way
  process.send_signal(signum)
  _, stderr = process.communicate(timeout=120)
  return process.returncode, stderr


@pytest.mark.slow  # converts a big input twice: the fast suite's time (CI runs it)
@pytest.mark.parametrize("signum, code", [(signal.SIGTERM, 42), (signal.SIGKILL, -9)])
def test_an_interrupted_conversion_finishes_when_run_again(tmp_path, big_npz, signum, code):
  npz, reference = big_npz
  output = tmp_path / "out"
  returncode, stderr = _start_and_stop_midway(npz, output, signum)
  assert returncode == code, stderr[-2000:]
  assert not (output / "manifest.json").exists()
  done = json.loads((output / "progress.json").read_text())["done"]
  assert 0 < len(done) < len(reference["splits"]["train"])
  if signum == signal.SIGTERM:
    assert "run the same command again to finish" in stderr
  result = run_convert("--from=npz", f"--input={npz}", f"--output={output}", "--shard_mb=1")
  assert result.returncode == 0, result.stderr[-2000:]
  written_now = int(result.stdout.split("(")[1].split()[0])
  assert written_now < 40_030  # the shards done before were not written again
  manifest = json.loads((output / "manifest.json").read_text())
  assert manifest["splits"] == reference["splits"]  # same shards, same bytes
  assert sorted(os.listdir(output)) == sorted(
      ["manifest.json"] + [s["file"] for split in manifest["splits"].values() for s in split])


# CSV tables: read in chunks, checked before anything is written ------------------------------

def _write_table(path, rows, columns=("a", "b", "label", "c")):
  """A CSV of `rows` rows of short decimals (row i, column j: a value from a fixed formula)."""
  i = np.arange(rows)[:, None]
  values = np.round(np.sin(i * 0.37 + np.arange(len(columns)) * 1.3) * 100, 3)
  values[:, list(columns).index("label")] = i[:, 0] % 3
  np.savetxt(path, values, fmt="%g", delimiter=",", header=",".join(columns), comments="")
  return path


def test_a_bad_cell_late_in_a_csv_fails_after_its_progress_naming_the_line(tmp_path):
  csv = _write_table(tmp_path / "table.csv", 6000)
  lines = csv.read_text().splitlines()
  cells = lines[4999].split(",")  # line 5,000 of the file
  lines[4999] = ",".join([cells[0], "n/a", *cells[2:]])
  csv.write_text("\n".join(lines) + "\n")
  output = tmp_path / "out"
  result = run_convert("--from=csv", f"--input={csv}", f"--output={output}", timeout=120)
  assert result.returncode == 2, result.stderr[-2000:]
  shown = [s.strip() for s in result.stderr.replace("\r", "\n").splitlines() if s.strip()]
  # the progress bar (wiped once it fails), then the one line of the error
  assert shown[0].startswith("checking table.csv"), result.stderr[-2000:]
  assert all(s.startswith("checking table.csv") for s in shown[:-1]), result.stderr[-2000:]
  assert shown[-1] == (f"distloop: error: {csv}: line 5000, column 'b' holds 'n/a', not a "
                       f"number")
  assert not output.exists()


def test_a_missing_label_column_names_the_label_flag(tmp_path):
  csv = _write_table(tmp_path / "table.csv", 20)
  with pytest.raises(DataError, match=r"table.csv: no column 'target' \(--label\); its columns "
                                      r"are 'a', 'b', 'label', 'c'$"):
    convert_inputs.csv(str(csv), convert_inputs.Options(label="target"))


@pytest.mark.parametrize("fmt, folder, options, expected", [
    ("csv", "table.csv", {"eval_fraction": 0.0}, r"--eval_fraction=0.0 of its 20 rows"),
    ("csv", "nowhere", {}, r"no such file or folder \(--input\)"),
    ("image_folder", "images", {"channels": 2}, r"^--channels=2: must be 3"),
    ("image_folder", "images", {"image_size": 0}, r"^--image_size=0: must be"),
    ("image_folder", "images", {"eval_fraction": 1.0}, r"^--eval_fraction=1.0: must be"),
    ("image_folder", "nowhere", {}, r"no such folder \(--input\)"),
])
def test_converter_messages_name_its_flags_not_config_fields(tmp_path, fmt, folder, options,
                                                             expected):
  _write_table(tmp_path / "table.csv", 20)
  (tmp_path / "images" / "train" / "cat").mkdir(parents=True)
  Image.new("RGB", (4, 4)).save(tmp_path / "images" / "train" / "cat" / "0.png")
  with pytest.raises(DataError, match=expected) as error:
    convert_inputs.FORMATS[fmt](str(tmp_path / folder),
                                convert_inputs.Options(**options))
  assert "data." not in str(error.value)


# The SHA-256 of every shard that the whole-table reader (main at bdec47d) wrote for this input.
_GOLDEN_SHARDS = {
    "held_out": {
        "train": ["c775eaee09fa3f9f89bf23f0615d72fc5807512fe9760854c88a53ace23d32f1"],
        "eval": ["647d9dd0c5ff9364c879a97a9de9e657a4af897ebb505311bde0b11e584c8379"]},
    "test_file": {
        "train": ["752802b872a2013cb140c9224ed4e469173f62552ca3b881870529a2f1136130"],
        "eval": ["269cefc9b42213fe1f8d85ab72fb04ffec8ddcd6e4078f706adc07cf2e735327"]}}


@pytest.mark.parametrize("layout", ["held_out", "test_file"])
def test_a_csv_converts_to_the_same_bytes_as_the_whole_table_reader(tmp_path, monkeypatch,
                                                                    layout):
  csv = _write_table(tmp_path / "table.csv", 3000)
  with open(csv, "a", encoding="utf-8") as f:  # what only the cell-by-cell reader reads
    f.write('\n"1.5",  2 ,1,"-0.25"\n\n7,8,2,9\n')
  if layout == "test_file":  # its columns in another order, CRLF line ends
    (tmp_path / "folder").mkdir()
    csv = csv.rename(tmp_path / "folder" / "train.csv").parent
    _write_table(tmp_path / "folder" / "test.csv", 500, ("c", "label", "b", "a"))
    test = (csv / "test.csv").read_text().replace("\n", "\r\n")
    (csv / "test.csv").write_bytes(test.encode())
  try:  # small chunks: many of them, a quoted row in the middle of one
    from input_pipelines.datasets import csv_rows  # pylint: disable=g-import-not-at-top
    monkeypatch.setattr(csv_rows, "CHUNK_CHARS", 4096)
  except ImportError:  # the whole-table reader (how the golden hashes were made)
    pass
  manifest = _convert("csv", csv, tmp_path / "out", seed=3)
  hashes = {split: [shard["sha256"] for shard in shards]
            for split, shards in manifest["splits"].items()}
  assert hashes == _GOLDEN_SHARDS[layout]
  assert manifest["metadata"]["feature_columns"] == ["a", "b", "c"]


def test_converting_a_csv_holds_a_chunk_not_the_file(tmp_path):
  import tracemalloc  # pylint: disable=g-import-not-at-top
  rows = 200_000
  csv = _write_table(tmp_path / "table.csv", rows, [f"c{i}" for i in range(23)] + ["label"])
  size = os.path.getsize(csv)  # 34 MB
  from input_pipelines.records import features  # pylint: disable=g-import-not-at-top
  features.encoder({})  # its imports are not the data's memory
  tracemalloc.start()
  try:
    source = convert_inputs.csv(str(csv), convert_inputs.Options())
    last = next(source.splits["train"].records(source.splits["train"].num_examples - 1))
    peak = tracemalloc.get_traced_memory()[1]
  finally:
    tracemalloc.stop()
  assert source.splits["train"].num_examples + source.splits["eval"].num_examples == rows
  assert len(last) > 0
  assert peak < size / 4, (peak, size)  # the table as float64 alone is over size


def test_bad_input_midway_leaves_an_empty_output_folder_empty(tmp_path):
  folder = _image_folder(tmp_path / "images", sizes=[(4, 4)] * 70)  # more than _plan samples
  (folder / "train" / "dog" / "9.png").write_bytes(b"\x89PNG\r\n\x1a\n broken")
  output = tmp_path / "out"
  output.mkdir()
  source = convert_inputs.image_folder(str(folder), convert_inputs.Options(image_size=4))
  with pytest.raises(DataError, match="9.png: cannot be decoded"):  # after 70 one-record shards
    convert.convert(source, str(output), shard_bytes=1, show_progress=False)
  assert os.listdir(output) == []
