"""A model_dir (or checkpoint.init_from) on object storage, `gs://` or `s3://`: refused
before anything runs, in one line naming the FUSE route. Without the refusal a URL
is a relative path: `gs://b/run` would train into ./gs:/b/run, a half-working path."""
import os

import pytest

from tests.cli import REPO, run_trainer

_FUSE = "mount the bucket with a FUSE driver (gcsfuse, mountpoint-s3, s3fs)"


@pytest.mark.parametrize("url, flags", [
    ("gs://bucket/run1", ["--config=synthetic"]),
    ("s3://bucket/run1", ["--config=synthetic"]),
    ("hdfs://namenode/run1", ["--config=synthetic"]),
    ("gs://bucket/run1", ["--mode=eval"]),  # no --config: before looking for its config.json
], ids=["gs", "s3", "hdfs", "eval without --config"])
def test_a_url_model_dir_is_one_line_naming_fuse(tmp_path, url, flags):
  """Catches a URL taken as a local relative path (the run would create ./gs:/...)."""
  result = run_trainer(url, *flags, "--config.train.steps=2", timeout=120)
  assert result.returncode == 2, result.stderr
  (line,) = result.error_lines()
  assert line.startswith(f"distloop: error: --model_dir={url}: ") and _FUSE in line, line
  assert "Traceback" not in result.stderr
  assert not os.path.exists(os.path.join(REPO, url.split(":")[0] + ":"))


def test_a_url_init_from_is_one_line_naming_fuse(tmp_path):
  model_dir = tmp_path / "run"
  result = run_trainer(model_dir, "--config=synthetic",
                       "--config.checkpoint.init_from=s3://bucket/pretrained", timeout=120)
  assert result.returncode == 2, result.stderr
  (line,) = result.error_lines()
  assert "checkpoint.init_from=s3://bucket/pretrained: s3:// URLs are not supported" in line
  assert _FUSE in line
  assert not model_dir.exists()


def test_the_python_api_raises_the_same_line(tmp_path, monkeypatch):
  import trainer  # pylint: disable=g-import-not-at-top
  from trainer.errors import UserError  # pylint: disable=g-import-not-at-top
  monkeypatch.chdir(tmp_path)
  with pytest.raises(UserError, match=r"--model_dir=gs://bucket/run1: gs:// URLs .*gcsfuse"):
    trainer.run("synthetic", "gs://bucket/run1")
  assert not os.listdir(tmp_path)
