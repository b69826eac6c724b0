"""`--mode=predict` run again on what it kept: input rows rewritten since the chunks were
scored (refused, never mixed), a committed chunk damaged (scored again), and the
output of a killed-and-rerun job the bytes of a clean one, every file, manifest.json
included (docs/predict.md "A rerun checks what it keeps").

One trained CNN and one clean output (on 2 replicas, with the config recorded in the
model_dir and overrides: the log line of issue 57 item 13) serve every test.
"""
import json
import shutil
import signal

import pytest

from tests.support.cli import run_trainer, train_ok

pytestmark = pytest.mark.slow  # python -m pytest -m slow (CI runs these too)

_ROWS, _CHUNK = 1001, 150  # 7 chunks, the last of 101 rows
_IMAGES = ["--config=synthetic", "--config.data.name=tests.plugins.predict_plugins:images",
           "--config.model.conv_filters=8", "--config.model.dense_units=16",
           "--config.data.num_train_examples=512", f"--config.data.num_eval_examples={_ROWS}",
           "--config.train.steps=5", "--config.train.steps_per_loop=5",
           "--config.runtime.deterministic=true"]
_PREDICT = ["--mode=predict", "--config.predict.global_batch_size=100",
            f"--config.predict.chunk_rows={_CHUNK}"]
_TWO_REPLICAS = ["--config.runtime.strategy=mirrored", "--config.runtime.num_cpu_devices=2"]


def _files(output) -> dict:
  """Every file of the output, by its path in it: what must be the same bytes."""
  return {str(path.relative_to(output)): path.read_bytes()
          for path in sorted(output.rglob("*")) if path.is_file()}


def _predict(model_dir, output, *flags, env=None):
  return run_trainer(model_dir, *_IMAGES, *_PREDICT, *flags,
                     f"--config.predict.output={output}", env=env)


@pytest.fixture(scope="module")
def cnn(tmp_path_factory):
  """(model_dir, the clean output, its run) of the CNN trained 5 steps; the output
  predicted with no --config (the model_dir's config.json), on 2 replicas."""
  model_dir = tmp_path_factory.mktemp("cnn")
  train_ok(model_dir, *_IMAGES)
  output = model_dir / "reference"
  result = run_trainer(model_dir, *_PREDICT, *_TWO_REPLICAS,
                       f"--config.predict.output={output}")
  assert result.returncode == 0, result.stderr[-3000:]
  return model_dir, output, result


def _one_error(result, said: str) -> str:
  assert result.returncode == 2, f"exit {result.returncode}\n{result.stderr[-3000:]}"
  errors = [line for line in result.error_lines() if line.startswith("distloop: error:")]
  assert len(errors) == 1 and said in errors[0], result.stderr[-3000:]
  assert "Traceback" not in result.stderr, result.stderr[-3000:]
  return errors[0]


def test_predict_logs_its_replicas_and_the_config_with_its_overrides(cnn):
  """The clean run says on how many replicas and which strategy it scores, and that its
  config is the recorded one with the overrides given (not the recorded one alone)."""
  model_dir, _, result = cnn
  assert "on 2 replica(s) (mirrored)" in result.stderr, result.stderr[-3000:]
  said = [line for line in result.stderr.splitlines() if "predict of step 5 with" in line]
  assert len(said) == 1, result.stderr[-3000:]
  assert f"the config recorded in {model_dir}/config.json and " in said[0], said
  assert "--config.runtime.strategy=mirrored" in said[0], said


def test_a_rerun_on_rewritten_rows_is_refused_and_on_the_same_rows_is_the_clean_output(
    cnn, tmp_path):
  """Killed after some chunks, the eval rows rewritten (the same count): the rerun is
  refused in one line naming chunk 0 and its rows, exit 2, nothing changed. Then the
  same data again (on 1 replica): every file the clean output's bytes, manifest.json
  and progress.json included. Then, finished, the last row rewritten: refused naming
  the last chunk. Reruns that compare only the data's name and row count, or a manifest
  that holds the run's seconds, fail here."""
  model_dir, reference, _ = cnn
  output = tmp_path / "out"
  result = _predict(model_dir, output, env={
      "PREDICT_READ_SECONDS": "0.05", "PREDICT_SIGNAL": "KILL", "PREDICT_SIGNAL_ROW": "700",
      "PREDICT_SIGNAL_ONCE": str(tmp_path / "kill")})
  assert result.returncode == -signal.SIGKILL, result.stderr[-3000:]
  with open(output / "progress.json") as f:
    assert json.load(f)["chunks"], "killed before a chunk was committed"
  before = _files(output)
  _one_error(_predict(model_dir, output, env={"PREDICT_CHANGED_ROWS": "3,140"}),
             "chunk 0 (rows 0..149) was scored on other input rows")
  assert _files(output) == before

  result = _predict(model_dir, output)
  assert result.returncode == 0, result.stderr[-3000:]
  assert _files(output) == _files(reference)

  _one_error(_predict(model_dir, output, env={"PREDICT_CHANGED_ROWS": str(_ROWS - 1)}),
             f"chunk 6 (rows 900..{_ROWS - 1}) was scored on other input rows")
  assert _files(output) == _files(reference)


def test_a_truncated_chunk_of_a_finished_output_is_scored_again(cnn, tmp_path):
  """A finished output's third Parquet part truncated to half: the rerun warns in one
  line naming chunk 2 and the file, scores rows 300.. again, and ends with the clean
  output's bytes (pyarrow reads the folder) and digest. A finished output taken as
  finished without checking its files' SHA-256 fails here."""
  import pyarrow.parquet as pq  # pylint: disable=import-outside-toplevel
  _, reference, _ = cnn
  model_dir = cnn[0]
  output = tmp_path / "out"
  shutil.copytree(reference, output)
  part = output / "parquet" / "part-00002-of-00007.parquet"
  part.write_bytes(part.read_bytes()[:part.stat().st_size // 2])
  result = _predict(model_dir, output)
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
