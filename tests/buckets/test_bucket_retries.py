"""A bucket's requests through store faults, in this process (issue 57): the retries are
distloop's, the same on both stores, bounded by one documented time and, for a lease
holder's writes, by the moment its lease could be taken over; a deleted lease, a
malformed bucket name and a commit marker without its step's files are each one clear
answer. No training here: the bucket, the mirror and the lease are driven directly
(tests/buckets/test_bucket_model_dir.py trains through faults: retries change no weight).
"""
# pylint: disable=import-outside-toplevel,protected-access  (the client libraries; the lease's state)
import concurrent.futures
import json
import os
import threading

import pytest

from tests.support.cli import run_trainer
from tests.support.object_stores import in_this_process

_LEASE = 1.0  # seconds: a holder cut off loses it in 1 s, its taker waits as long


@pytest.fixture
def in_process(object_store, monkeypatch, tmp_path):
  """The store's environment in this process (its proxy), staging under tmp_path."""
  yield from in_this_process(object_store, monkeypatch, tmp_path)


def _mirror(url: str, local, env: dict | None = None):
  """A trainer's view of `url`: its own client (made with `env`, else this process's)."""
  from trainer.store import object_stores, mirror
  saved = {name: os.environ.get(name) for name in env or {}}
  os.environ.update(env or {})
  try:
    os.makedirs(local, exist_ok=True)
    return mirror.Mirror(url, object_stores.open_bucket(url), object_stores.parse(url)[2], str(local))
  finally:
    for name, value in saved.items():
      if value is None:
        os.environ.pop(name)
      else:
        os.environ[name] = value


def _a_step(model_dir, step: int) -> str:
  """checkpoints/<step> in a staging directory, as orbax leaves it (two files)."""
  step_dir = os.path.join(str(model_dir), "checkpoints", str(step))
  os.makedirs(os.path.join(step_dir, "state"))
  for name in ("_CHECKPOINT_METADATA", "state/weights"):
    with open(os.path.join(step_dir, name), "w") as f:
      f.write(f"step {step}: {name}")
  return os.path.join(str(model_dir), "checkpoints")


# --- 6. An outage is ridden out up to one bound, on both stores ---------------------------

def test_an_outage_is_ridden_out_up_to_the_bound_then_one_line(in_process, monkeypatch):
  """The store refuses connections for 5 s while 40 writes are under way at once (a
  step's files, the logs, the lease): each rides it out; with the bound lowered to 1 s
  (DISTLOOP_BUCKET_RETRY_SECONDS, for tests) an outage is one line saying how long it
  was retried. Catches S3 giving up within about a second (botocore's retry quota, 500
  tokens a client, spent by the retries of requests in flight: 35 of the 40 writes
  failed), while docs/scaling-out.md and GCS said 120 s."""
  from trainer.store import object_stores
  url = in_process.new_url("run")
  bucket = object_stores.open_bucket(url)
  in_process.stop()
  threading.Timer(5, in_process.start).start()
  with concurrent.futures.ThreadPoolExecutor(40) as pool:
    for done in [pool.submit(bucket.write, f"run/after-an-outage/{i}", b"written")
                 for i in range(40)]:
      done.result()
  assert len(in_process.list(f"{url}/after-an-outage")) == 40

  monkeypatch.setenv("DISTLOOP_BUCKET_RETRY_SECONDS", "1")
  in_process.stop()
  try:
    with pytest.raises(object_stores.BucketError) as raised:
      bucket.write("run/past-the-bound", b"never")
  finally:
    in_process.start()
  message = str(raised.value)
  assert "\n" not in message and not raised.value.permanent, message
  assert message.startswith(f"cannot write {url}/past-the-bound: no answer after 1 s of "
                            f"retries ("), message


# --- 2. A holder cut off at its commit writes nothing once its lease could be taken -------

def test_a_holder_cut_off_at_its_commit_writes_nothing_after_its_deadline(in_process,
                                                                          tmp_path):
  """The holder's every request is answered 503 (cut off: it goes through the store's
  side proxy) as it commits step 10; another trainer, which the fault does not reach,
  takes the lease over after lease_seconds,
  commits step 20 and ends; then the holder's store answers again. The holder's commit
  must have failed in one line naming the lease, and nothing of its own be in the bucket:
  only the taker's step. Catches a holder whose write is retried past its lease (the
  client libraries retried for up to 120 s: its commit marker landed after the taker
  had finished, a marker with no files)."""
  from trainer.errors import StorageError
  from trainer.store import mirror
  from trainer.store.lease import BucketLease
  store = in_process
  url = store.new_url("run")
  holder_mirror = _mirror(url, tmp_path / "holder", store.side_env)  # the side way in
  holder = BucketLease.acquire(holder_mirror, _LEASE)
  holder_steps = _a_step(tmp_path / "holder", 10)
  failed = []

  def commit():
    try:
      holder_mirror.commit_step(holder_steps, 10)
    except Exception as e:  # pylint: disable=broad-except
      failed.append(e)

  store.side_proxy.deny(503)  # the holder is cut off from here on
  committing = threading.Thread(target=commit)
  committing.start()
  taker_mirror = _mirror(url, tmp_path / "taker")
  taker = BucketLease.acquire(taker_mirror, 30)
  try:
    taker_mirror.commit_step(_a_step(tmp_path / "taker", 20), 20)
  finally:
    taker.release()
  finished = sorted(store.list(url))
  store.side_proxy.passthrough()  # the holder's connection is back
  committing.join(timeout=180)
  holder.release()

  assert not committing.is_alive()
  assert len(failed) == 1 and isinstance(failed[0], StorageError), failed
  assert f"lost the writer lease {url}/.lock" in str(failed[0]), failed[0]
  assert sorted(store.list(url)) == finished, "the holder wrote after its lease's deadline"
  assert not [name for name in finished if name.startswith("checkpoints/10/")], finished
  assert f"checkpoints/20/{mirror.COMMIT_MARKER}" in finished and ".lock" not in finished


def test_a_commit_marker_without_its_files_is_no_step(in_process, tmp_path):
  """A bucket holding step 10's commit marker but not every file it lists (a holder's
  marker landed after the step was removed), step 20 whole, and step 30 with a marker
  of the old kind (one line, no list) and no checkpoint metadata: only step 20 is
  staged, and the next commit removes steps 10 and 30 from the bucket. Catches a marker
  alone taken for a step (restored, kept, resumed from)."""
  from trainer.store import mirror
  store = in_process
  url = store.new_url("run")
  writer = _mirror(url, tmp_path / "writer")
  writer.commit_step(_a_step(tmp_path / "writer", 20), 20)
  marker = json.loads(store.read(f"{url}/checkpoints/20/{mirror.COMMIT_MARKER}"))
  assert marker["files"] == ["_CHECKPOINT_METADATA", "state/weights"], marker
  store.write(f"{url}/checkpoints/10/{mirror.COMMIT_MARKER}", json.dumps(marker).encode())
  store.write(f"{url}/checkpoints/10/_CHECKPOINT_METADATA", b"{}")
  store.write(f"{url}/checkpoints/30/{mirror.COMMIT_MARKER}", b"committed step 30\n")

  staged = mirror.staged(url)
  assert sorted(os.listdir(os.path.join(staged, "checkpoints"))) == ["20"]
  reader = mirror.of(staged)
  reader.commit_step(_a_step(staged, 40), 40)
  assert sorted({name.split("/")[1] for name in store.list(url)
                 if name.startswith("checkpoints/")}) == ["20", "40"]


# --- 7. A lease deleted under its holder ---------------------------------------------------

def test_a_deleted_lease_is_said_deleted(in_process, tmp_path, monkeypatch):
  """The `.lock` object deleted while its holder renews it: the renewal thread ends
  without a traceback, and the holder's check says the lease was deleted (not that it
  could not be renewed); its release writes nothing. Catches S3's NoSuchKey (a PutObject
  If-Match on no object) killing the renewal thread with a traceback."""
  from trainer.errors import StorageError
  from trainer.store.lease import BucketLease
  crashed = []
  monkeypatch.setattr(threading, "excepthook", crashed.append)
  url = in_process.new_url("run")
  lease = BucketLease.acquire(_mirror(url, tmp_path / "holder"), _LEASE)
  in_process.delete(f"{url}/.lock")
  lease._thread.join(timeout=10)
  assert not lease._thread.is_alive() and not crashed, crashed
  with pytest.raises(StorageError, match=rf"lost the writer lease {url}/.lock: it was "
                                         rf"deleted "):
    lease.check()
  lease.release()
  assert in_process.list(url) == []


# --- 8. A malformed bucket name ------------------------------------------------------------

_NOWHERE = "http://127.0.0.1:9"  # a name is checked before any request


@pytest.mark.parametrize("scheme, says, env", [
    ("s3", 'Invalid bucket name "Bad_Bucket!"',
     {"AWS_ENDPOINT_URL": _NOWHERE, "AWS_ACCESS_KEY_ID": "test",
      "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1"}),
    ("gs", "invalid bucket name 'Bad_Bucket!'",
     {"STORAGE_EMULATOR_HOST": _NOWHERE, "GOOGLE_CLOUD_PROJECT": "test"}),
])
def test_a_malformed_bucket_name_is_exit_2_with_its_reason(scheme, says, env, tmp_path):
  """Catches boto3's 'Parameter validation failed:' cut at its first line (the reason is
  on the next), exit 1; google-cloud-storage's ValueError a traceback."""
  url = f"{scheme}://Bad_Bucket!/run"
  result = run_trainer(url, "--config=synthetic", env={"TMPDIR": str(tmp_path), **env},
                       timeout=120)
  errors = [line for line in result.stderr.splitlines() if line.startswith("distloop: error:")]
  assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
  assert len(errors) == 1 and f"--model_dir={url}" in errors[0] and says in errors[0], errors
