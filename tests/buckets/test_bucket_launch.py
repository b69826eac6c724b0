"""`python -m trainer.launch --num_workers=2` on a bucket model_dir (gs://, s3://): the two
workers train the weights of two replicas in one process, bit for bit, and only the chief
writes the bucket. The job and its emulator run in one private network namespace
(tests/support/bucket_job.py): TensorFlow's servers listen on 0.0.0.0, and the test's own
emulators are out of that namespace's reach."""
import json
import os
import subprocess
import sys

import pytest

from tests.support.cli import REPO, user_environment
from tests.support.object_stores import unavailable
from tests.support.processes import assert_same_state, checkpoint_arrays, loopback_only, needs_loopback
from tests.cluster.test_multi_worker import _FLAGS, _STEPS, two_replicas  # noqa: F401  (a fixture)

pytestmark = [pytest.mark.slow, needs_loopback]


@pytest.mark.parametrize("scheme", ["gs", "s3"])
def test_two_workers_on_a_bucket_reach_the_weights_of_two_replicas(tmp_path, two_replicas,
                                                                 scheme):
  """Catches a worker writing the bucket too (two writers: the chief's steps deleted or
  overwritten), a worker restoring or agreeing on another step than the chief, and a
  bucket run whose weights differ from a disk run's (a client library drawing from the
  random state Keras seeds from)."""
  if unavailable(scheme):
    pytest.skip(unavailable(scheme))
  copy = tmp_path / "bucket"
  job = subprocess.run(
      [*loopback_only(), sys.executable, os.path.join(REPO, "tests", "support", "bucket_job.py"), scheme,
       str(copy), "trainer.launch", "--num_workers=2", "--", "--model_dir={url}", *_FLAGS],
      cwd=REPO, env=user_environment(), capture_output=True, text=True, timeout=600)
  assert job.returncode == 0, job.stdout[-4000:] + job.stderr[-4000:]
  assert "/tmp/distloop-" not in job.stdout + job.stderr  # the bucket is named, not the staging
  assert sorted(os.listdir(copy / "checkpoints")) == ["20", "40", "60"]
  for step in ("20", "40", "60"):
    assert (copy / "checkpoints" / step / "commit_success.txt").is_file()
  assert (copy / "export" / str(_STEPS) / "saved_model.pb").is_file()
  assert_same_state(checkpoint_arrays(copy, _STEPS), two_replicas, atol=0)


@pytest.mark.parametrize("scheme", ["gs"])
def test_a_ray_train_run_on_a_bucket_reports_its_checkpoint_there(tmp_path, two_replicas,
                                                                   scheme):
  """Catches a Ray job refusing a bucket model_dir (as every URL was), a restarted chief
  waiting for a flock a bucket has not, and a reported checkpoint that names the staging
  copy of a worker (gone with it) instead of the bucket's committed step."""
  if unavailable(scheme):
    pytest.skip(unavailable(scheme))
  pytest.importorskip("ray", reason="Ray is not installed (the [ray] extra)")
  from tests.cluster.test_ray import _RAY_ENV  # pylint: disable=g-import-not-at-top
  copy, result = tmp_path / "bucket", tmp_path / "result.json"
  job = subprocess.run(
      [*loopback_only(), sys.executable, os.path.join(REPO, "tests", "support", "bucket_job.py"), scheme,
       str(copy), "tests.support.ray_job", "--model_dir={url}", *_FLAGS, "--num_workers=2",
       f"--storage_path={tmp_path / 'ray_results'}"],
      cwd=REPO, env={**user_environment(), **_RAY_ENV, "RAY_JOB_RESULT": str(result)},
      capture_output=True, text=True, timeout=900)
  assert job.returncode == 0, job.stdout[-4000:] + job.stderr[-4000:]
  reported = json.loads(result.read_text())
  assert reported["checkpoint_dir"] == f"{scheme}://bucket-1/run/checkpoints/{_STEPS}"
  assert reported["metrics"]["step"] == _STEPS
  assert_same_state(checkpoint_arrays(copy, _STEPS), two_replicas, atol=0)
