"""A model_dir (or checkpoint.init_from) given as a URL: gs:// and s3:// are buckets
distloop writes (trainer/store/object_stores.py, mirror.py; tests/buckets/test_bucket_model_dir.py);
any other scheme is refused before anything runs, in one line naming the FUSE route.
Without the refusal a URL is a relative path: `hdfs://nn/run` would train into
./hdfs:/nn/run, a half-working path."""
import os

import pytest

from tests.support.cli import REPO, run_trainer

_FUSE = "mount that storage with a FUSE driver and give the mount path, or copy to gs:// or s3://"


@pytest.mark.parametrize("url, flags", [
    ("hdfs://namenode/run1", ["--config=synthetic"]),
    ("az://container/run1", ["--config=synthetic"]),
    ("ftp://host/run1", ["--config=synthetic"]),
    ("hdfs://namenode/run1", ["--mode=eval"]),  # no --config: before looking for its config.json
], ids=["hdfs", "az", "ftp", "eval without --config"])
def test_another_scheme_is_one_line_naming_fuse(url, flags):
  """Catches a URL taken as a local relative path (the run would create ./hdfs:/...)."""
  scheme = url.split(":")[0]
  result = run_trainer(url, *flags, "--config.train.steps=2", timeout=120)
  assert result.returncode == 2, result.stderr
  (line,) = result.error_lines()
  assert line.startswith(f"distloop: error: --model_dir={url}: {scheme}:// is not supported"), line
  assert _FUSE in line, line
  assert "Traceback" not in result.stderr
  assert not os.path.exists(os.path.join(REPO, scheme + ":"))


def test_another_schemes_init_from_is_one_line_naming_fuse(tmp_path):
  model_dir = tmp_path / "run"
  result = run_trainer(model_dir, "--config=synthetic",
                       "--config.checkpoint.init_from=hdfs://namenode/pretrained", timeout=120)
  assert result.returncode == 2, result.stderr
  (line,) = result.error_lines()
  assert "checkpoint.init_from=hdfs://namenode/pretrained: hdfs:// is not supported" in line
  assert _FUSE in line
  assert not model_dir.exists()


def test_the_python_api_raises_the_same_line(tmp_path, monkeypatch):
  import trainer  # pylint: disable=g-import-not-at-top
  from trainer.errors import UserError  # pylint: disable=g-import-not-at-top
  monkeypatch.chdir(tmp_path)
  with pytest.raises(UserError, match=r"^model_dir=hdfs://nn/run1: hdfs:// is not supported.*"
                                      r"FUSE driver"):  # the API's argument, not the flag
    trainer.run("synthetic", "hdfs://nn/run1")
  assert not os.listdir(tmp_path)


def test_gs_and_s3_are_buckets_not_refused(object_store, tmp_path):
  """gs:// and s3:// are accepted (refused before commit be2f12b): an empty bucket path
  is staged and read, so --mode=eval without --config says there is no config.json at
  that URL (not the staging path), and a warm start from it finds no checkpoint there;
  nothing is written to the bucket, no model_dir on disk, no staging directory left."""
  url = object_store.new_url("run")
  env = {**object_store.env, "TMPDIR": str(tmp_path)}  # where the staging goes (and goes away)
  result = run_trainer(url, "--mode=eval", env=env, timeout=120)
  assert result.returncode == 2, result.stderr
  (line,) = result.error_lines()
  assert line == (f"distloop: error: --mode=eval: no {url}/config.json to read the model's "
                  f"config from (nothing trained there yet?); pass the training run's --config "
                  f"and overrides"), line
  result = run_trainer(tmp_path / "warm", "--config=synthetic",
                       f"--config.checkpoint.init_from={url}", env=env, timeout=120)
  assert result.returncode == 2, result.stderr
  (line,) = result.error_lines()
  assert line == f"distloop: error: checkpoint.init_from: no checkpoint in {url}", line
  assert object_store.list(url) == [] and not (tmp_path / "warm").exists()
  assert not [name for name in os.listdir(tmp_path) if name.startswith("distloop-")]
