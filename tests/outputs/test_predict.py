"""`--mode=predict`, exactly once: every row once, in order, the same bytes after any stops
and kills, on any replica or worker count and batch size (docs/predict.md).

The stops land at chosen rows: the data plug-in signals its own process when it reads
one (tests/plugins/predict_plugins.py), rows picked at random past what is committed.
"""
import json
import os
import random
import shutil
import signal

import numpy as np
import pytest

from tests.support.cli import REPO, run_trainer, train_ok
from tests.support.processes import TrainerProcess, loopback_only, needs_loopback

pytestmark = pytest.mark.slow  # python -m pytest -m slow (CI runs these too)

_ROWS, _CHUNK = 1001, 150  # 7 chunks, the last of 101 rows
_IMAGES = ["--config=synthetic", "--config.data.name=tests.plugins.predict_plugins:images",
           "--config.model.conv_filters=8", "--config.model.dense_units=16",
           "--config.data.num_train_examples=512", f"--config.data.num_eval_examples={_ROWS}",
           "--config.train.steps=5", "--config.train.steps_per_loop=5",
           "--config.runtime.deterministic=true"]
_GAN = [f"--config={os.path.join(REPO, 'examples', 'gan.py')}",
        "--config.data.name=tests.plugins.predict_plugins:gan_mixture",
        "--config.data.num_train_examples=960", f"--config.data.num_eval_examples={_ROWS}",
        "--config.train.steps=5", "--config.train.steps_per_loop=5",
        "--config.checkpoint.interval=5", "--config.runtime.deterministic=true"]
_PREDICT = ["--mode=predict", "--config.predict.global_batch_size=100",
            f"--config.predict.chunk_rows={_CHUNK}"]
_SHAPES = {"1": [], "2": ["--config.runtime.strategy=mirrored",
                          "--config.runtime.num_cpu_devices=2"]}
_SLOW_READS = {"PREDICT_READ_SECONDS": "0.05"}  # ~1 s of reading: stops land mid-scoring


def _chunks(output) -> dict:
  """The chunks' files (Parquet and records) by name: what must be the same bytes."""
  return {str(path.relative_to(output)): path.read_bytes()
          for sub in ("parquet", "records") for path in sorted((output / sub).iterdir())}


def _files(output) -> dict:
  """Every file of the output, by its path in it (the manifests and .lock included)."""
  return {str(path.relative_to(output)): path.read_bytes()
          for path in sorted(output.rglob("*")) if path.is_file()}


def _committed(output) -> int:
  with open(output / "progress.json") as f:
    return sum(chunk["rows"] for chunk in json.load(f)["chunks"])


def _predict(model_dir, output, *flags, shape="1", env=None):
  return run_trainer(model_dir, *flags, *_PREDICT, *_SHAPES[shape],
                     f"--config.predict.output={output}", env=env)


@pytest.fixture(scope="module")
def cnn(tmp_path_factory):
  """(model_dir, the uninterrupted predictions' folder) of the CNN, 5 steps."""
  model_dir = tmp_path_factory.mktemp("cnn")
  train_ok(model_dir, *_IMAGES)
  output = model_dir / "reference"
  result = _predict(model_dir, output, *_IMAGES)
  assert result.returncode == 0, result.stderr[-3000:]
  return model_dir, output


def test_rows_in_order_equal_the_export_at_any_batch_size(cnn, tmp_path):
  """1,001 rows at batch 500: each row once, in order, with its label, the export's
  `serving_default` on that example and softmax(model(x, training=False)) of the
  checkpoint's weights (to 1e-5), the same bytes as at batch 100; the
  records shards hold the Parquet's rows; the manifest names the step, the model and
  the digest. Rows of another order, a partial last batch lost or doubled, or the
  trained weights where eval uses others fail here."""
  import pyarrow.parquet as pq  # pylint: disable=import-outside-toplevel
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  from input_pipelines.records import records  # pylint: disable=import-outside-toplevel
  from tests.plugins import predict_plugins  # pylint: disable=import-outside-toplevel
  model_dir, reference = cnn
  output = tmp_path / "batch500"
  result = run_trainer(model_dir, *_IMAGES, "--mode=predict",
                       "--config.predict.global_batch_size=500",
                       f"--config.predict.chunk_rows={_CHUNK}",
                       f"--config.predict.output={output}")
  assert result.returncode == 0, result.stderr[-3000:]
  summary = json.loads(result.stdout.strip().splitlines()[-1])
  assert summary["rows"] == _ROWS and summary["checkpoint_step"] == 5, summary
  assert _chunks(output) == _chunks(reference)

  table = pq.read_table(output / "parquet").to_pydict()
  assert list(table) == ["index", "probabilities", "label"]
  assert table["index"] == list(range(_ROWS))
  config = type("DataConfig", (), {"num_train_examples": 512, "num_eval_examples": _ROWS})
  examples = predict_plugins.images(config, 0)[1]
  assert table["label"] == examples.labels.tolist()
  serve = tf.saved_model.load(str(model_dir / "export" / "5")).signatures["serving_default"]
  expected = serve(inputs=tf.constant(examples.features))["probabilities"].numpy()
  np.testing.assert_allclose(np.asarray(table["probabilities"]), expected, atol=1e-5, rtol=0)
  logits = _model_from_checkpoint(model_dir, 5)(examples.features, training=False)
  np.testing.assert_allclose(np.asarray(table["probabilities"]), tf.nn.softmax(logits),
                             atol=1e-5, rtol=0)

  with open(output / "manifest.json") as f:
    manifest = json.load(f)
  with open(model_dir / "run_id.json") as f:
    run_id = json.load(f)["run_id"]
  assert (manifest["rows"], manifest["checkpoint_step"], manifest["model"]) == (_ROWS, 5, run_id)
  assert manifest["digest"] == summary["digest"]
  train, _ = records.build(type("DataConfig", (), {"dir": str(output / "records")}), 0)
  features, labels = train.assemble(train.read_leaves(np.arange(_ROWS)))
  np.testing.assert_array_equal(labels.numpy(), np.asarray(table["probabilities"], np.float32))
  np.testing.assert_array_equal(features["index"].numpy().reshape(-1), np.arange(_ROWS))


def _model_from_checkpoint(model_dir, step: int):
  """The built-in CNN of _IMAGES, its weights read from the checkpoint by plain orbax."""
  import configs  # pylint: disable=import-outside-toplevel
  import models  # pylint: disable=import-outside-toplevel
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  from tests.support.processes import read_checkpoint  # pylint: disable=import-outside-toplevel
  config = configs.get("synthetic")
  with config.unlocked():
    config.model.conv_filters, config.model.dense_units, config.model.num_classes = 8, 16, 10
  model = models.build(config.model, tf.TensorSpec([None, 28, 28, 1], tf.float32))
  saved = read_checkpoint(model_dir, step, items=("model",))
  assert len(saved) == len(model.weights), (sorted(saved), [v.path for v in model.weights])
  for variable in model.weights:
    variable.assign(saved[f"model/{variable.path}"])
  return model


def test_sigterm_at_three_moments_then_other_shapes_gives_the_same_bytes(cnn, tmp_path):
  """SIGTERM at 3 random rows, each rerun on another replica count: exit 42 and one line
  saying how far it got each time, then the rest; the chunks are the uninterrupted run's,
  byte for byte. A chunk committed twice, a row lost at a stop, a stop that does not wait
  for its chunk, or rows that depend on the replica count fail here."""
  model_dir, reference = cnn
  output, rng = tmp_path / "out", random.Random(47)
  for attempt, shape in enumerate(("1", "2", "1")):
    done = _committed(output) if output.exists() else 0
    row = rng.randrange(done + 1, min(done + 300, _ROWS - 2 * _CHUNK))
    result = _predict(model_dir, output, *_IMAGES, shape=shape, env={
        **_SLOW_READS, "PREDICT_SIGNAL": "TERM", "PREDICT_SIGNAL_ROW": str(row),
        "PREDICT_SIGNAL_ONCE": str(tmp_path / f"term{attempt}")})
    assert result.returncode == 42, f"row {row}: exit {result.returncode}\n{result.stderr[-3000:]}"
    stopped = [line for line in result.stderr.splitlines() if "preempted after row" in line]
    assert len(stopped) == 1, result.stderr[-3000:]
    assert _committed(output) > done, (row, done)
  result = _predict(model_dir, output, *_IMAGES, shape="2")
  assert result.returncode == 0, result.stderr[-3000:]
  assert _chunks(output) == _chunks(reference)
  with open(output / "manifest.json") as f, open(reference / "manifest.json") as g:
    assert json.load(f)["digest"] == json.load(g)["digest"]


def test_sigkill_at_five_moments_loses_or_doubles_no_row(cnn, tmp_path):
  """SIGKILL at 5 random rows (mid-chunk, mid-write), each followed by a rerun: the end
  holds every row once, the uninterrupted run's bytes. Files of a chunk written but not
  committed taken for committed, or a chunk counted before its files are whole, fail here."""
  import pyarrow.parquet as pq  # pylint: disable=import-outside-toplevel
  model_dir, reference = cnn
  output, rng = tmp_path / "out", random.Random(4747)
  for attempt in range(5):
    done = _committed(output) if output.exists() else 0
    row = rng.randrange(done + 1, min(done + 200, _ROWS - 1))
    result = _predict(model_dir, output, *_IMAGES, env={
        **_SLOW_READS, "PREDICT_SIGNAL": "KILL", "PREDICT_SIGNAL_ROW": str(row),
        "PREDICT_SIGNAL_ONCE": str(tmp_path / f"kill{attempt}")})
    assert result.returncode == -signal.SIGKILL, f"row {row}: exit {result.returncode}"
  result = _predict(model_dir, output, *_IMAGES, shape="2")
  assert result.returncode == 0, result.stderr[-3000:]
  assert pq.read_table(output / "parquet").to_pydict()["index"] == list(range(_ROWS))
  assert _chunks(output) == _chunks(reference)


def _one_error(result, said: str) -> None:
  assert result.returncode == 2, f"exit {result.returncode}\n{result.stderr[-3000:]}"
  errors = [line for line in result.error_lines() if line.startswith("distloop: error:")]
  assert len(errors) == 1 and said in errors[0], result.stderr[-3000:]
  assert "Traceback" not in result.stderr, result.stderr[-3000:]


def test_rows_rewritten_after_a_kill_are_refused_and_the_same_rows_give_the_clean_output(
    cnn, tmp_path):
  """Killed after some chunks, eval rows of chunk 0 rewritten (the same count): the rerun
  is refused in one line naming chunk 0 and its rows, exit 2, nothing changed. Then the
  same rows again, with the config recorded in model_dir and overrides for 2 replicas:
  it logs its replicas and the overrides, and every file is the clean output's bytes,
  manifest.json and progress.json included. A rerun that compares only the data's name
  and row count, a manifest that holds the run's seconds, or a log that says "the config
  recorded" alone while overrides were given, fail here."""
  model_dir, reference = cnn
  output = tmp_path / "out"
  result = _predict(model_dir, output, *_IMAGES, env={
      **_SLOW_READS, "PREDICT_SIGNAL": "KILL", "PREDICT_SIGNAL_ROW": "700",
      "PREDICT_SIGNAL_ONCE": str(tmp_path / "kill")})
  assert result.returncode == -signal.SIGKILL, result.stderr[-3000:]
  assert _committed(output) >= _CHUNK, "killed before a chunk was committed"
  before = _files(output)
  _one_error(_predict(model_dir, output, *_IMAGES, env={"PREDICT_CHANGED_ROWS": "3,140"}),
             "chunk 0 (rows 0..149) was scored on other input rows")
  assert _files(output) == before

  result = run_trainer(model_dir, *_PREDICT, *_SHAPES["2"], f"--config.predict.output={output}")
  assert result.returncode == 0, result.stderr[-3000:]
  assert _files(output) == _files(reference)
  assert "on 2 replica(s) (mirrored)" in result.stderr, result.stderr[-3000:]
  said = [line for line in result.stderr.splitlines() if "predict of step 5 with" in line]
  assert len(said) == 1 and "--config.runtime.strategy=mirrored" in said[0], said
  assert f"the config recorded in {model_dir}/config.json and " in said[0], said


def test_a_truncated_chunk_of_a_finished_output_is_scored_again(cnn, tmp_path):
  """A finished output's third Parquet part truncated to half: the rerun warns in one
  line naming chunk 2 and the file, scores rows 300.. again, and ends with the clean
  output's bytes (pyarrow reads the folder) and digest. A finished output taken as
  finished without checking its files' SHA-256 fails here."""
  import pyarrow.parquet as pq  # pylint: disable=import-outside-toplevel
  model_dir, reference = cnn
  output = tmp_path / "out"
  shutil.copytree(reference, output)
  part = output / "parquet" / "part-00002-of-00007.parquet"
  part.write_bytes(part.read_bytes()[:part.stat().st_size // 2])
  result = _predict(model_dir, output, *_IMAGES)
  assert result.returncode == 0, result.stderr[-3000:]
  warned = [line for line in result.stderr.splitlines() if "missing or damaged" in line]
  assert len(warned) == 1 and "parquet/part-00002-of-00007.parquet of chunk 2" in warned[0], (
      result.stderr[-3000:])
  summary = json.loads(result.stdout.strip().splitlines()[-1])
  assert summary["rows_scored"] == _ROWS - 2 * _CHUNK, summary
  assert _files(output) == _files(reference)
  assert pq.read_table(output / "parquet").num_rows == _ROWS
  with open(reference / "manifest.json") as f:
    assert summary["digest"] == json.load(f)["digest"]


def test_gan_samples_are_a_function_of_the_row(tmp_path):
  """examples/gan.py's predict_step draws each row's noise with step.normal: killed and
  rerun on 2 replicas, the samples are the uninterrupted run's, bit for bit. Noise drawn
  per batch or per process (tf.random.normal) fails here."""
  model_dir = tmp_path / "gan"
  train_ok(model_dir, *_GAN)
  reference = tmp_path / "reference"
  assert _predict(model_dir, reference, *_GAN).returncode == 0
  output = tmp_path / "out"
  result = _predict(model_dir, output, *_GAN, env={
      **_SLOW_READS, "PREDICT_SIGNAL": "KILL", "PREDICT_SIGNAL_ROW": "420",
      "PREDICT_SIGNAL_ONCE": str(tmp_path / "kill")})
  assert result.returncode == -signal.SIGKILL, result.stderr[-3000:]
  result = _predict(model_dir, output, *_GAN, shape="2")
  assert result.returncode == 0, result.stderr[-3000:]
  assert _chunks(output) == _chunks(reference)


@needs_loopback
def test_two_workers_write_the_bytes_of_one_process(cnn, tmp_path):
  """`trainer.launch --num_workers=2`: each worker scores its replicas' slices, the chief
  commits; the chunks are one process's, byte for byte. Rows gathered in worker order
  rather than row order, or a non-chief writing, fail here."""
  model_dir, reference = cnn
  output = tmp_path / "out"
  job = TrainerProcess(None, "--num_workers=2", "--", f"--model_dir={model_dir}", *_IMAGES,
                       *_PREDICT, "--config.runtime.strategy=multi_worker_mirrored",
                       f"--config.predict.output={output}", module="trainer.launch",
                       prefix=loopback_only())
  assert job.finish() == 0, job.output[-3000:]
  assert _chunks(output) == _chunks(reference)


def test_refusals_are_one_line_and_write_nothing(cnn, tmp_path):
  """Exit 2, one line, nothing written or changed: another model's predictions in the
  output folder; a folder that holds something else; a model_dir with no checkpoint."""
  model_dir, reference = cnn
  other = tmp_path / "other"
  train_ok(other, *_IMAGES, "--config.runtime.seed=1")
  before = _chunks(reference)
  foreign = tmp_path / "foreign"
  foreign.mkdir()
  (foreign / "notes.txt").write_text("mine")
  for where, output, said in ((other, reference, "another model"),
                              (model_dir, foreign, "holds no predictions"),
                              (tmp_path / "empty", tmp_path / "new", "no checkpoint")):
    result = _predict(where, output, *_IMAGES, *(["--config.runtime.seed=1"] if where == other else []))
    assert result.returncode == 2, f"exit {result.returncode}\n{result.stderr[-3000:]}"
    errors = [line for line in result.error_lines() if line.startswith("distloop: error:")]
    assert len(errors) == 1 and said in errors[0], result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
  assert _chunks(reference) == before
  assert sorted(p.name for p in foreign.iterdir()) == ["notes.txt"]
  assert not (tmp_path / "new").exists()
