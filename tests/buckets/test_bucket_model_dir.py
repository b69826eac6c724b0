"""A model_dir on a bucket (gs://, s3://; issue 45), against the emulators of
tests/support/object_stores.py: every mode runs there and leaves a whole model_dir in the bucket;
a bucket run is the disk run bit for bit, and resumes and warm-starts as one; one writer
holds a lease, a dead one's lease is taken over, two takeovers never both win; bad input
is one line, exit 2, nothing written; what is in the bucket is read by plain tools.

Runs are the CLI in a subprocess where only a process shows it (exit codes, one line on
stderr, the staging directory gone at exit, a SIGKILL), in-process otherwise (the Python
API, the lease's race). Each subprocess gets a TMPDIR of its own, so that its staging
directory (`distloop-SCHEME-BUCKET-*`) is found, or found gone, whatever else runs here.
Before commit be2f12b every URL was refused (exit 2): each test here fails there.
"""
# pylint: disable=redefined-outer-name  (pytest fixtures)
import csv
import dataclasses
import glob
import io
import itertools
import json
import os
import re
import signal
import socket
import threading
import time

import numpy as np
import pytest

from tests.support.cli import REPO, run_trainer
from tests.support.object_stores import in_this_process
from tests.support.processes import TrainerProcess, assert_same_state, read_checkpoint

_STEPS = 20
_FLAGS = ("--config=synthetic", "--config.train.steps_per_loop=10",
          "--config.checkpoint.interval=10", "--config.checkpoint.max_to_keep=5",
          "--config.data.num_train_examples=640", "--config.data.num_eval_examples=200",
          "--config.train.global_batch_size=32", "--config.runtime.deterministic=true")
_STAGING = re.compile(r"distloop-(gs|s3)-")  # a staging directory's name (mirror.staged)
_ERROR = "distloop: error: "
_WAIT = "--config.train.actions=tests/plugins/bucket_actions.py:wait_at"
_counter = itertools.count()


# --- Helpers -----------------------------------------------------------------------------

def _tmpdir(tmp_path_factory) -> str:
  return str(tmp_path_factory.mktemp("tmpdir"))


def _env(store, tmpdir: str, **more) -> dict:
  return {**store.env, "TMPDIR": tmpdir, **more}


def _no_staging(output: str, tmpdir: str) -> None:
  """Nothing the process said names its staging directory (the URL instead), and none is
  left once it exited."""
  for line in output.splitlines():
    assert not _STAGING.search(line) and tmpdir not in line, line
  assert not glob.glob(os.path.join(tmpdir, "distloop-*")), os.listdir(tmpdir)


def _cli(store, url, *flags, tmp_path_factory, timeout=300, env=None):
  """`python -m trainer --model_dir=url ...` with the store's environment; checks that no
  staging path shows and none is left."""
  tmpdir = _tmpdir(tmp_path_factory)
  result = run_trainer(url, *flags, env=_env(store, tmpdir, **(env or {})), timeout=timeout)
  _no_staging(result.stdout + result.stderr, tmpdir)
  return result


def _ok(result) -> None:
  assert result.returncode == 0, f"exit {result.returncode}\n{result.stderr[-4000:]}"


def _one_line_refusal(result, *parts: str, after: str = "", logged: bool = False) -> str:
  """The refusal's line (exit 2, no traceback), the only line on stderr but for one
  log line matching `after` (the watch of a held lease says what it waits for), or
  (`logged`: refused once training started) the run's log lines before it."""
  assert result.returncode == 2, result.stderr[-3000:]
  assert "Traceback" not in result.stderr, result.stderr[-3000:]
  lines = result.error_lines()
  if after:
    assert len(lines) == 2 and re.search(after, lines[0]), lines
    lines = lines[1:]
  if logged:
    assert all(re.match(r"[IW]\d{4} ", line) for line in lines[:-1]), lines
    lines = lines[-1:]
  (line,) = lines
  assert line.startswith(_ERROR), line
  for part in parts:
    assert part in line, line
  return line


def _download(store, url: str, directory) -> str:
  """Every object under `url` into `directory` (made), as plain files."""
  for name in store.list(url):
    path = os.path.join(str(directory), *name.split("/"))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
      f.write(store.read(f"{url}/{name}"))
  return str(directory)


def _copy(store, source: str, destination: str) -> None:
  for name in store.list(source):
    store.write(f"{destination}/{name}", store.read(f"{source}/{name}"))


def _contents(store, url: str) -> dict:
  return {name: store.read(f"{url}/{name}") for name in store.list(url)}


def _bucket_weights(store, url: str, step: int, tmp_path) -> dict:
  """The weights of the bucket's checkpoints/<step>, by plain orbax from a downloaded copy."""
  local = tmp_path / f"copy-{next(_counter)}"
  _download(store, f"{url}/checkpoints/{step}", local / "checkpoints" / str(step))
  return read_checkpoint(local, step)


def _wait_for_commit(store, url: str, step: int) -> None:
  """Until the bucket holds `step`'s commit marker (a writer commits in the background)."""
  deadline = time.monotonic() + 60
  while f"checkpoints/{step}/commit_success.txt" not in store.list(url):
    assert time.monotonic() < deadline, store.list(url)
    time.sleep(0.1)


def _committed_steps(names: list[str], directory: str = "checkpoints") -> list[int]:
  return sorted(int(name.split("/")[1]) for name in names
                if re.fullmatch(rf"{directory}/\d+/commit_success\.txt", name))


def _config(steps: int = _STEPS):
  """_FLAGS as a ConfigDict (the Python API)."""
  import configs  # pylint: disable=import-outside-toplevel
  config = configs.get("synthetic")
  config.unlock()
  config.train.steps, config.train.steps_per_loop = steps, 10
  config.checkpoint.interval, config.checkpoint.max_to_keep = 10, 5
  config.data.num_train_examples, config.data.num_eval_examples = 640, 200
  config.train.global_batch_size = 32
  config.runtime.deterministic = True
  return config


@pytest.fixture
def in_process(object_store, monkeypatch, tmp_path):
  """The store's environment in this process, staging under tmp_path, removed after."""
  yield from in_this_process(object_store, monkeypatch, tmp_path)


# --- Shared runs -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def disk_run(tmp_path_factory):
  """The same run on local disk, to step 40 (steps 10..40 kept): its step 20 is a 20-step
  run's (a constant learning rate: train.steps changes nothing before)."""
  model_dir = tmp_path_factory.mktemp("disk") / "run"
  _ok(run_trainer(model_dir, *_FLAGS, "--config.train.steps=40"))
  return model_dir


@dataclasses.dataclass
class Trained:
  url: str
  result: object
  objects: list


@pytest.fixture(scope="module")
def _trained_runs():
  return {}


def _trained(store, runs: dict, tmp_path_factory) -> Trained:
  if store.scheme not in runs:
    url = store.new_url("run")
    result = _cli(store, url, *_FLAGS, f"--config.train.steps={_STEPS}",
                  tmp_path_factory=tmp_path_factory)
    _ok(result)
    runs[store.scheme] = Trained(url, result, store.list(url))
  return runs[store.scheme]


@pytest.fixture
def trained(object_store, _trained_runs, tmp_path_factory) -> Trained:
  """A 20-step `--mode=train` run on a bucket of each store (one per module and store);
  tests that change the bucket work on a copy."""
  return _trained(object_store, _trained_runs, tmp_path_factory)


# --- 1. Every mode on a bucket -----------------------------------------------------------

def test_train_leaves_a_whole_model_dir_in_the_bucket(trained, object_store):
  """Catches a piece left only in the staging directory (a step without its commit
  marker, metrics.csv or the event files never put, JSON files, the export), the lease
  object left after a normal end, and output naming the staging path."""
  names = trained.objects
  assert _committed_steps(names) == [10, 20]
  for step in (10, 20):
    step_files = [n for n in names if n.startswith(f"checkpoints/{step}/")]
    assert {f"checkpoints/{step}/commit_success.txt", f"checkpoints/{step}/_CHECKPOINT_METADATA",
            f"checkpoints/{step}/model/manifest.ocdbt"} <= set(step_files), step_files
  for name in ("config.json", "summary.json", "finished.json", "metrics.csv", "run_id.json",
               "export/20/saved_model.pb", "export/20/variables/variables.index"):
    assert name in names, names
  assert any(n.startswith("tensorboard/train/events.out.tfevents.") for n in names), names
  assert any(n.startswith("tensorboard/eval/events.out.tfevents.") for n in names), names
  assert any(n.startswith("config_history/") for n in names), names
  assert ".lock" not in names  # deleted at a normal end
  assert not [n for n in names if ".orbax-checkpoint-tmp" in n or n.endswith(".download")]
  summary = json.loads(object_store.read(f"{trained.url}/summary.json"))
  assert summary["step"] == _STEPS
  assert json.loads(object_store.read(f"{trained.url}/finished.json"))["step"] == _STEPS
  rows = list(csv.DictReader(io.StringIO(object_store.read(f"{trained.url}/metrics.csv")
                                         .decode())))
  assert sorted({int(r["step"]) for r in rows if r["split"] == "train"}) == [10, 20]
  assert f"outputs   {trained.url} (summary.json, export/20/" in trained.result.stderr
  assert f"Exported SavedModel to {trained.url}/export/20" in trained.result.stderr


def _as_trained(names: list[str], trained) -> list[str]:
  """`names` but the event files an eval mode added to tensorboard/eval (as on disk):
  the shared trained runs are read by several tests."""
  return [name for name in names if not name.startswith("tensorboard/eval/")
          or name in trained.objects]


def test_eval_and_export_modes_read_the_bucket(trained, object_store, tmp_path_factory):
  """--mode=eval of the bucket's step 20 = the run's own final eval; --mode=export prints
  the export's URL. Catches a reading mode that does not find the bucket's config.json or
  steps, and the export's path printed as the staging directory's (it was:
  /tmp/distloop-gs-bucket-1-.../export/20)."""
  summary = json.loads(object_store.read(f"{trained.url}/summary.json"))
  result = _cli(object_store, trained.url, "--mode=eval", tmp_path_factory=tmp_path_factory)
  _ok(result)
  metrics = json.loads(result.stdout.strip().splitlines()[-1])
  assert metrics["step"] == _STEPS and metrics["examples"] == 200
  assert metrics["accuracy"] == summary["eval_accuracy"]
  assert metrics["loss"] == pytest.approx(summary["eval_loss"], abs=1e-6)
  assert f"Restored checkpoint at step 20 from {trained.url}/checkpoints" in result.stderr

  result = _cli(object_store, trained.url, "--mode=export", tmp_path_factory=tmp_path_factory)
  _ok(result)
  assert result.stdout.strip().splitlines()[-1] == f"{trained.url}/export/20"
  # A reader takes no lease and changes nothing the run wrote; --mode=eval adds its own
  # event file in tensorboard/eval, as on disk.
  assert _as_trained(object_store.list(trained.url), trained) == trained.objects


def test_python_api_export_returns_the_url(trained, in_process):
  """trainer.run(config, URL, mode="export") returns the export's URL. Catches the
  staging path returned (meaningless to the caller, removed with the staging)."""
  import trainer  # pylint: disable=import-outside-toplevel
  exported = trainer.run(_config(), trained.url, mode="export")
  assert exported == f"{trained.url}/export/{_STEPS}"
  assert _as_trained(in_process.list(trained.url), trained) == trained.objects


@dataclasses.dataclass
class Sidecar:
  url: str
  sidecar: TrainerProcess
  job: TrainerProcess
  tmpdirs: tuple


@pytest.fixture(scope="module")
def _sidecar_runs():
  return {}


@pytest.fixture
def sidecar_run(object_store, _sidecar_runs, tmp_path_factory) -> Sidecar:
  """A --mode=continuous_eval sidecar started on an empty bucket path, then a 30-step
  --mode=train_and_eval job there that waits at step 20 until the sidecar has evaluated
  step 10 (one per module and store)."""
  if object_store.scheme in _sidecar_runs:
    return _sidecar_runs[object_store.scheme]
  url = object_store.new_url("run")
  flags = [*_FLAGS, "--config.train.steps=30", "--config.eval.interval=10",
           "--config.eval.poll_seconds=0.5", _WAIT]
  go = tmp_path_factory.mktemp("go") / "go"
  sidecar_tmp, job_tmp = _tmpdir(tmp_path_factory), _tmpdir(tmp_path_factory)
  sidecar = TrainerProcess(url, *flags, "--mode=continuous_eval",
                           env=_env(object_store, sidecar_tmp))
  job = None
  try:
    sidecar.wait_for(r"continuous_eval: watching", timeout=120)
    job = TrainerProcess(url, *flags, "--mode=train_and_eval",
                         env=_env(object_store, job_tmp, DISTLOOP_TEST_WAIT_AT="20",
                                  DISTLOOP_TEST_GO=str(go)))
    sidecar.wait_for(r"eval at step 10 \|", timeout=180)
    go.touch()
    assert job.wait(timeout=180) == 0, job.output[-4000:]
    assert sidecar.wait(timeout=120) == 0, sidecar.output[-4000:]
  finally:
    for process in (sidecar, job):
      if process is not None:
        process.kill()
  _sidecar_runs[object_store.scheme] = Sidecar(url, sidecar, job, (sidecar_tmp, job_tmp))
  return _sidecar_runs[object_store.scheme]


def _event_steps(store, url: str, tmp_path, pid: int, tag: str = "loss") -> list[int]:
  """The steps of `tag` in the event file process `pid` wrote under `url`, read by
  TensorBoard's own reader from a downloaded copy ([] if it wrote none there)."""
  from tensorboard.backend.event_processing import event_accumulator  # pylint: disable=import-outside-toplevel
  local = _download(store, url, tmp_path / f"events-{next(_counter)}")
  files = [f for f in glob.glob(os.path.join(local, "events.out.tfevents.*"))
           if f".{pid}." in os.path.basename(f)]
  if not files:
    return []
  (path,) = files
  accumulator = event_accumulator.EventAccumulator(
      path, size_guidance={event_accumulator.TENSORS: 0})
  accumulator.Reload()
  return [event.step for event in accumulator.Tensors(tag)]


@pytest.mark.slow
def test_train_and_eval_with_a_continuous_eval_sidecar(sidecar_run, object_store, disk_run,
                                                       tmp_path):
  """--mode=continuous_eval on the bucket sees the steps of a train_and_eval job running
  meanwhile, and ends at the final step; the job's evals are in the bucket's
  tensorboard/eval. Catches a sidecar that never looks in the bucket (it did: started
  before the first step, its staging had no checkpoints/ and it never refreshed), one
  that never ends (finished.json not seen), and the job's steps not committed in the
  bucket before the next."""
  run = sidecar_run
  evaluated = [int(s) for s in re.findall(r"eval at step (\d+) \|", run.sidecar.output)]
  assert evaluated[0] == 10 and evaluated[-1] == 30 and evaluated == sorted(set(evaluated))
  assert "the final step 30 is done" in run.sidecar.output, run.sidecar.output[-3000:]
  for process, tmpdir in zip((run.sidecar, run.job), run.tmpdirs):
    _no_staging(process.output, tmpdir)
  names = object_store.list(run.url)
  assert _committed_steps(names) == [10, 20, 30] and ".lock" not in names
  assert "summary.json" in names and "export/30/saved_model.pb" in names
  assert _event_steps(object_store, f"{run.url}/tensorboard/eval", tmp_path,
                      run.job.process.pid) == [10, 20, 30]
  assert_same_state(_bucket_weights(object_store, run.url, 30, tmp_path),
                    read_checkpoint(disk_run, 30), atol=0)


@pytest.mark.slow
def test_the_sidecars_eval_scalars_reach_the_bucket(sidecar_run, object_store, tmp_path):
  """The sidecar's own eval scalars (its event file in tensorboard/eval, as on disk:
  tests/outputs/test_continuous_eval.py) are in the bucket once it exits. Catches an eval mode,
  which holds no lease, leaving its event file in its staging copy (removed at exit)."""
  run = sidecar_run
  evaluated = [int(s) for s in re.findall(r"eval at step (\d+) \|", run.sidecar.output)]
  assert _event_steps(object_store, f"{run.url}/tensorboard/eval", tmp_path,
                      run.sidecar.process.pid) == evaluated


# --- 2. A bucket run is the disk run, bit for bit ----------------------------------------

def test_a_bucket_run_is_the_disk_run_bit_for_bit(trained, object_store, disk_run, tmp_path):
  """The bucket's step 20 (downloaded, read by plain orbax) = the disk run's. Catches a
  client library drawing from Python's global `random`, which Keras draws its layers'
  default seeds from (google-resumable-media's multipart boundary did: other weights on
  gs://; runtime.keras_seeds_from), and a checkpoint put incompletely."""
  assert_same_state(_bucket_weights(object_store, trained.url, _STEPS, tmp_path),
                    read_checkpoint(disk_run, _STEPS), atol=0)


@pytest.mark.slow
def test_retried_faults_change_no_weight(object_store, disk_run, tmp_path, tmp_path_factory):
  """The first two writes of the lease answered 503 (retried between the seeding and the
  model's build), one other request in seven answered 503 all run long, and the lease
  renewed every 0.5 s while the model is built: step 20 is still the disk run's, bit for
  bit, on both stores (issue 57). Catches a retry's backoff jitter drawn from Python's
  global `random`, which Keras draws its layers' default seeds from (botocore's
  ExponentialBackoff bound random.random at import: weights 0.537 away on s3://), and
  any draw from it in the lease renewal's thread during the build."""
  url = object_store.new_url("retried")
  object_store.proxy.fail_one_in(7)
  # The lease's create: S3 names the object in the path, GCS in the body only.
  object_store.proxy.fail_next(2, "/retried/.lock" if object_store.scheme == "s3"
                               else "ifGenerationMatch=0")
  result = _cli(object_store, url, *_FLAGS, f"--config.train.steps={_STEPS}",
                "--config.checkpoint.lease_seconds=2", tmp_path_factory=tmp_path_factory)
  lease_faults_left, faults = object_store.proxy.fail_next_left, object_store.proxy.faults
  object_store.proxy.passthrough()
  _ok(result)
  assert lease_faults_left == 0 and faults > 10, (lease_faults_left, faults)
  assert_same_state(_bucket_weights(object_store, url, _STEPS, tmp_path),
                    read_checkpoint(disk_run, _STEPS), atol=0)


# --- 3. Resume and warm start ------------------------------------------------------------

def test_the_same_command_with_more_steps_resumes_from_the_bucket(trained, object_store,
                                                                  disk_run, tmp_path,
                                                                  tmp_path_factory):
  """A copy of the 20-step bucket run, trained on to 40 by the same command: it restores
  step 20 from the bucket and ends at the 40-step disk run's weights; metrics.csv holds
  each step once. Catches a resume that starts over (steps not staged), one that
  restores but trains another trajectory, and rows lost or doubled in metrics.csv."""
  url = object_store.new_url("resumed")
  _copy(object_store, trained.url, url)
  result = _cli(object_store, url, *_FLAGS, "--config.train.steps=40",
                tmp_path_factory=tmp_path_factory)
  _ok(result)
  assert f"Restored checkpoint at step 20 from {url}/checkpoints" in result.stderr
  names = object_store.list(url)
  assert _committed_steps(names) == [10, 20, 30, 40] and ".lock" not in names
  assert json.loads(object_store.read(f"{url}/finished.json"))["step"] == 40
  assert_same_state(_bucket_weights(object_store, url, 40, tmp_path),
                    read_checkpoint(disk_run, 40), atol=0)
  rows = list(csv.DictReader(io.StringIO(object_store.read(f"{url}/metrics.csv").decode())))
  losses = [int(r["step"]) for r in rows if r["split"] == "train" and r["name"] == "loss"]
  assert losses == [10, 20, 30, 40]


@pytest.mark.parametrize("scheme, suffix", [("gs", ""), ("s3", "/checkpoints"),
                                           ("gs", "/checkpoints/20")],
                         ids=["gs-model_dir", "s3-checkpoints", "gs-step"])
def test_warm_start_from_a_bucket(scheme, suffix, request, _trained_runs, tmp_path_factory,
                                  monkeypatch, tmp_path, caplog):
  """checkpoint.init_from=URL (a bucket model_dir, its checkpoints/ or one step; each
  form on one store, the staging being the same code): the run on disk starts from the
  bucket's step-20 weights (a learning rate of 0 keeps them: its checkpoint equals the
  source's), and the source is left untouched. Catches a URL's suffix not understood
  (staged as a model_dir of its own: no checkpoint there) and a warm start that writes
  to (or leases) its source."""
  import trainer  # pylint: disable=import-outside-toplevel
  store = request.getfixturevalue({"gs": "gcs_store", "s3": "s3_store"}[scheme])
  trained = _trained(store, _trained_runs, tmp_path_factory)
  staging = in_this_process(store, monkeypatch, tmp_path)
  in_process = next(staging)
  request.addfinalizer(staging.close)
  config = _config(steps=2)
  config.train.steps_per_loop, config.checkpoint.interval = 2, 2
  config.train.learning_rate = 0.0
  config.train.optimizer = "sgd"
  config.checkpoint.init_from = trained.url + suffix
  with caplog.at_level("INFO"):
    summary = trainer.run(config, str(tmp_path / "warm"))
  assert summary["step"] == 2
  assert f"Warm start: weights from {trained.url}/checkpoints/20" in caplog.text
  warm = read_checkpoint(tmp_path / "warm", 2, items=("model",))
  local = _download(in_process, f"{trained.url}/checkpoints/20",
                    tmp_path / "source" / "checkpoints" / "20")
  assert local and warm
  assert_same_state(warm, read_checkpoint(tmp_path / "source", 20, items=("model",)), atol=0)
  assert _as_trained(in_process.list(trained.url), trained) == trained.objects


# --- 4. One writer: the lease ------------------------------------------------------------

def _lease_flags(lease_seconds: float):
  return [*_FLAGS, "--config.train.steps=30", f"--config.checkpoint.lease_seconds={lease_seconds}",
          _WAIT]


@pytest.mark.slow
def test_a_second_trainer_is_refused_and_the_first_finishes(object_store, tmp_path,
                                                            tmp_path_factory):
  """Two trainers on one bucket model_dir: the second exits 2 in one line naming the
  holder's host and pid, writes nothing; the first goes on to the end and deletes the
  lease. Catches a second writer let in (no create-if-absent), one refused without the
  holder's name, and a refused one that deletes the holder's lease."""
  url = object_store.new_url("run")
  flags = _lease_flags(4)
  go = tmp_path / "go"
  first_tmp = _tmpdir(tmp_path_factory)
  first = TrainerProcess(url, *flags, env=_env(object_store, first_tmp,
                                               DISTLOOP_TEST_WAIT_AT="20",
                                               DISTLOOP_TEST_GO=str(go)))
  try:
    first.wait_for(r"test waiting at step 20", timeout=180)
    _wait_for_commit(object_store, url, 10)
    lease = json.loads(object_store.read(f"{url}/.lock"))
    assert lease["pid"] == first.process.pid and lease["host"] == socket.gethostname()
    before = [n for n in object_store.list(url) if n != ".lock"]
    second = _cli(object_store, url, *flags, tmp_path_factory=tmp_path_factory, timeout=120)
    line = _one_line_refusal(second, f"--model_dir={url} is in use by another trainer",
                             f"host {socket.gethostname()}, pid {first.process.pid}, since ",
                             after=rf"\] --model_dir={re.escape(url)} is leased to host .* "
                                   rf"waiting up to \d+ s to see whether it is alive")
    assert [n for n in object_store.list(url) if n != ".lock"] == before, line
    assert json.loads(object_store.read(f"{url}/.lock"))["pid"] == first.process.pid
    go.touch()
    assert first.wait(timeout=180) == 0, first.output[-4000:]
  finally:
    first.kill()
  _no_staging(first.output, first_tmp)
  names = object_store.list(url)
  assert _committed_steps(names) == [10, 20, 30] and ".lock" not in names


@pytest.mark.slow
def test_a_killed_holders_lease_is_taken_over_after_lease_seconds(object_store, disk_run,
                                                                  tmp_path, tmp_path_factory):
  """A holder SIGKILLed after committing step 10 leaves its lease object; the next run
  waits lease_seconds, takes it over in one line naming the dead holder, resumes at
  step 10 and ends at the disk run's weights; its normal end deletes the lease. Catches
  a lease never taken over (every restart after a kill refused for good), one taken at
  once (no wait for a live holder's renewal), and the takeover not said."""
  url = object_store.new_url("run")
  flags = _lease_flags(3)
  holder = TrainerProcess(url, *flags, env=_env(object_store, _tmpdir(tmp_path_factory),
                                                DISTLOOP_TEST_WAIT_AT="20",
                                                DISTLOOP_TEST_GO=str(tmp_path / "never")))
  try:
    holder.wait_for(r"test waiting at step 20", timeout=180)
    _wait_for_commit(object_store, url, 10)
    holder.send(signal.SIGKILL)
    holder.wait(timeout=30)
  finally:
    holder.kill()
  lease = json.loads(object_store.read(f"{url}/.lock"))  # still there: nobody released it
  assert lease["pid"] == holder.process.pid
  started = time.monotonic()
  result = _cli(object_store, url, *flags, tmp_path_factory=tmp_path_factory)
  _ok(result)
  assert time.monotonic() - started >= 3
  took = [line for line in result.stderr.splitlines() if "Took over the writer lease" in line]
  assert len(took) == 1, result.stderr[-3000:]
  assert (f"Took over the writer lease {url}/.lock of host {socket.gethostname()}, "
          f"pid {holder.process.pid}, since ") in took[0], took[0]
  assert "checkpoint.lease_seconds=3" in took[0], took[0]
  assert f"Restored checkpoint at step 10 from {url}/checkpoints" in result.stderr
  names = object_store.list(url)
  assert _committed_steps(names) == [10, 20, 30] and ".lock" not in names
  assert_same_state(_bucket_weights(object_store, url, 30, tmp_path),
                    read_checkpoint(disk_run, 30), atol=0)


def _mirror(url: str, local):
  """A Mirror of `url` (a trainer's view of it), its bucket client made in this process."""
  from trainer.store import object_stores, mirror  # pylint: disable=import-outside-toplevel
  _, _, prefix = object_stores.parse(url)
  os.makedirs(local, exist_ok=True)
  return mirror.Mirror(url, object_stores.open_bucket(url), prefix, str(local))


def _expired_lease(store, url: str, lease_seconds: float = 1.0) -> None:
  store.write(f"{url}/.lock", json.dumps({
      "host": "gone-host", "pid": 4242, "since": "2020-01-01 00:00:00 +0000",
      "token": "dead", "lease_seconds": lease_seconds}).encode())


def test_two_simultaneous_takeovers_of_an_expired_lease_one_wins(in_process, tmp_path):
  """Two trainers released at the same moment on an expired lease, 4 rounds: each time
  exactly one holds it and the other is refused naming it (one compare-and-swap of the
  same version succeeds). Catches a takeover by a plain write (both win)."""
  from trainer.errors import UserError  # pylint: disable=import-outside-toplevel
  from trainer.store.lease import BucketLease  # pylint: disable=import-outside-toplevel
  url = in_process.new_url("run")
  mirrors = [_mirror(url, tmp_path / f"trainer{i}") for i in range(2)]
  for round_ in range(4):
    # A dead holder's lease of 0.2 s, expired by the store's clock too (S3's is in whole
    # seconds). The contenders' own leases last 3 s: whichever loses the swap, or reads
    # the winner's lease first, sees it renewed (every 0.75 s) before it could expire.
    _expired_lease(in_process, url, lease_seconds=0.2)
    time.sleep(1.2)
    barrier = threading.Barrier(2)
    results = [None, None]

    def take(i, barrier=barrier, results=results):
      barrier.wait()
      try:
        results[i] = BucketLease.acquire(mirrors[i], 3.0)
      except UserError as e:
        results[i] = e

    threads = [threading.Thread(target=take, args=(i,)) for i in range(2)]
    for thread in threads:
      thread.start()
    for thread in threads:
      thread.join(timeout=60)
    won = [r for r in results if isinstance(r, BucketLease)]
    lost = [r for r in results if isinstance(r, UserError)]
    try:
      assert len(won) == 1 and len(lost) == 1, (round_, results)
      assert f"--model_dir={url} is in use by another trainer (host " in str(lost[0])
      assert "gone-host" not in str(lost[0])  # it names the winner, not the dead holder
      assert json.loads(in_process.read(f"{url}/.lock"))["token"] == won[0]._record["token"]  # pylint: disable=protected-access
    finally:
      for lease in won:
        lease.release()
    assert in_process.read(f"{url}/.lock") is None  # released: deleted


def _taken_over(store, tmp_path):
  """(url, the old holder's mirror, its lease, the new holder's lease): the old holder,
  cut off from the store (its renewals fail), had its lease taken over after
  lease_seconds (1 s). Each holder has a local metrics.csv and the bucket holds the new
  holder's."""
  from trainer.store import object_stores  # pylint: disable=import-outside-toplevel
  from trainer.store.lease import BucketLease  # pylint: disable=import-outside-toplevel
  url = store.new_url("run")
  old_mirror = _mirror(url, tmp_path / "old")
  new_mirror = _mirror(url, tmp_path / "new")
  old = BucketLease.acquire(old_mirror, 1.0)

  def cut_off(*args, **kwargs):
    raise object_stores.BucketError(f"cannot write {url}/.lock: connection refused", permanent=False)

  old_mirror.bucket.replace = cut_off  # its renewals fail from now on
  new = BucketLease.acquire(new_mirror, 1.0)  # waits ~1 s, then takes over
  store.write(f"{url}/metrics.csv", b"the new holder's\n")
  (tmp_path / "old" / "metrics.csv").write_text("step,split,name,value\n5,train,loss,1\n")
  return url, old_mirror, old, new


def _nothing_more_written(store, url: str, new) -> None:
  assert store.list(url) == [".lock", "metrics.csv"]
  assert store.read(f"{url}/metrics.csv") == b"the new holder's\n"
  assert json.loads(store.read(f"{url}/.lock"))["token"] == new._record["token"]  # pylint: disable=protected-access


def test_a_holder_whose_lease_was_taken_over_stops_writing(in_process, tmp_path):
  """A holder whose lease was taken over while it was cut off: back, its check() raises
  StorageError (its lease's deadline passed before the takeover, issue 57: the renewal
  thread says it could not be renewed, or, had it read the lease after the takeover,
  names the new holder); a checkpoint commit of its then writes nothing (no step file,
  no metrics.csv over the new holder's), nor does its release (the new holder's lease
  stays). Catches a holder that goes on writing: commit_step put the step's files and
  the logs before checking the lease (it did)."""
  from trainer.errors import StorageError  # pylint: disable=import-outside-toplevel
  url, old_mirror, old, new = _taken_over(in_process, tmp_path)
  try:
    del old_mirror.bucket.replace  # back: its next renewal finds the lease taken
    deadline = time.monotonic() + 10
    while old._lost is None and time.monotonic() < deadline:  # pylint: disable=protected-access
      time.sleep(0.05)
    with pytest.raises(StorageError, match=r"lost the writer lease .*(another trainer took "
                                           r"it over \(host |could not be renewed for 1 s)"):
      old.check()
    step_dir = tmp_path / "old" / "checkpoints" / "5"
    step_dir.mkdir(parents=True)
    (step_dir / "_CHECKPOINT_METADATA").write_text("{}")
    with pytest.raises(StorageError, match="lost the writer lease"):
      old_mirror.commit_step(str(tmp_path / "old" / "checkpoints"), 5)
    old.release()
    _nothing_more_written(in_process, url, new)
  finally:
    new.release()
  assert in_process.read(f"{url}/.lock") is None


def test_a_holder_cut_off_past_lease_seconds_writes_nothing_at_its_end(in_process, tmp_path):
  """A holder that could not renew its lease for lease_seconds (still cut off, not yet
  knowing it was taken over): check() raises, and its release puts no logs over the new
  holder's and leaves its lease. Catches a release that trusts a lease it could not
  renew (it pushed metrics.csv and the event files whole over the new holder's)."""
  from trainer.errors import StorageError  # pylint: disable=import-outside-toplevel
  url, old_mirror, old, new = _taken_over(in_process, tmp_path)
  try:
    # S3's Last-Modified counts whole seconds: the store's clock may expire a lease up to
    # 1 s before its holder's own count does.
    while time.monotonic() - old._renewed <= 1.0:  # pylint: disable=protected-access
      time.sleep(0.05)
    del old_mirror.bucket.replace
    old.release()  # before any check() told it
    _nothing_more_written(in_process, url, new)
    with pytest.raises(StorageError, match=r"lost the writer lease .*could not be renewed"):
      old.check()
  finally:
    new.release()


# --- 5. Bad input ------------------------------------------------------------------------

def _bucket_exists(store, name: str) -> bool:
  client = store.client(direct=True)
  if store.scheme == "gs":
    return client.lookup_bucket(name) is not None
  try:
    client.head_bucket(Bucket=name)
    return True
  except client.exceptions.ClientError:
    return False


def test_a_bucket_that_does_not_exist(object_store, tmp_path_factory):
  """Catches a missing bucket found only at the first write (a traceback after training),
  or created."""
  name = f"no-such-bucket-{next(_counter)}"
  url = f"{object_store.scheme}://{name}/run"
  result = _cli(object_store, url, *_FLAGS, tmp_path_factory=tmp_path_factory, timeout=120)
  _one_line_refusal(result, f"--model_dir={url}", "no such bucket", "nothing was written")
  assert not _bucket_exists(object_store, name)


def test_a_denied_credential(object_store, tmp_path_factory):
  """Every request answered 403 (the service's own error body): one line saying access is
  denied, exit 2. Catches a 403 retried as transient (minutes), or a traceback."""
  url = object_store.new_url("run")
  object_store.proxy.deny(403)
  result = _cli(object_store, url, *_FLAGS, tmp_path_factory=tmp_path_factory, timeout=120)
  object_store.proxy.passthrough()
  _one_line_refusal(result, f"--model_dir={url}", "access denied")
  assert object_store.list(url) == []


_SECRET = "distloop-test-secret-0f3a9c"


def test_no_secret_is_printed_or_logged(s3_store, tmp_path_factory):
  """A run, then a run denied (403), with a secret key of its own: neither prints nor
  logs it. Catches a credential echoed in an error line (a client's repr, a signed URL)
  or in the log's config dump."""
  url = s3_store.new_url("run")
  ran = _cli(s3_store, url, *_FLAGS, "--config.train.steps=2", tmp_path_factory=tmp_path_factory,
             env={"AWS_SECRET_ACCESS_KEY": _SECRET})
  _ok(ran)
  s3_store.proxy.deny(403)
  denied = _cli(s3_store, s3_store.new_url("run"), *_FLAGS, tmp_path_factory=tmp_path_factory,
                env={"AWS_SECRET_ACCESS_KEY": _SECRET})
  s3_store.proxy.passthrough()
  _one_line_refusal(denied, "access denied")
  for result in (ran, denied):
    assert _SECRET not in result.stdout + result.stderr
  assert all(_SECRET.encode() not in s3_store.read(f"{url}/{name}")
             for name in s3_store.list(url))


@pytest.mark.parametrize("url, says", [
    ("gs:///run", "names no bucket: gs://BUCKET/PATH"),
    ("gs://", "names no bucket: gs://BUCKET/PATH"),
    ("s3:///run", "names no bucket: s3://BUCKET/PATH"),
    ("hdfs://nn/run", "hdfs:// is not supported"),
    ("az://c/run", "az:// is not supported"),
])
def test_a_url_distloop_cannot_use(url, says, tmp_path, tmp_path_factory):
  """Catches a URL taken as a local relative path (./gs:/run, ./hdfs:/nn/run)."""
  tmpdir = _tmpdir(tmp_path_factory)
  result = run_trainer(url, *_FLAGS, env={"TMPDIR": tmpdir}, timeout=120)
  _one_line_refusal(result, f"--model_dir={url}", says)
  _no_staging(result.stderr, tmpdir)
  assert not glob.glob(os.path.join(REPO, "*:"))


@pytest.mark.parametrize("flags, says", [
    (["--config=synthetic", "--config.nosuchfield=1"], "unknown config field --config.nosuchfield"),
    (["--mode=eval"], "no {url}/config.json to read the model's config from"),
], ids=["unknown field", "eval of nothing"])
def test_flags_refused_after_staging(flags, says, object_store, tmp_path_factory):
  """Bad flags found once the URL was staged (the config is looked for in its staging
  directory): one line naming the URL, exit 2, nothing in the bucket, and the staging
  directory gone. Catches the staging left in /tmp by an exit before main() (it was:
  a refused flag exits through sys.exit, past the CLI's removal)."""
  url = object_store.new_url("run")
  result = _cli(object_store, url, *flags, tmp_path_factory=tmp_path_factory, timeout=120)
  _one_line_refusal(result, says.format(url=url))
  assert object_store.list(url) == []


@pytest.mark.parametrize("refused_by", ["init_from", "action"])
def test_a_run_refused_after_staging_leaves_an_empty_path_empty(refused_by, trained,
                                                                object_store,
                                                                tmp_path_factory):
  """Refused once the lease is held: a warm start from another model's checkpoint (the
  mlp from the CNN's step 20), and a user's Action returning 3 at the first boundary
  (after config.json, run_id.json and the event files were written, before any step):
  exit 2, one line, and the empty bucket path is empty again, lease included; the
  source of init_from untouched. Catches a refused run leaving its config.json,
  run_id.json, tensorboard/ or .lock behind (planted: remove_everything skipped)."""
  url = object_store.new_url("run")
  flags, says = {
      "init_from": (["--config.model.name=mlp", f"--config.checkpoint.init_from={trained.url}"],
                    "checkpoint.init_from"),
      "action": (["--config.train.actions=tests/plugins/action_plugins.py:returns_a_number"],
                 "action 'returns_a_number' returned 3"),
  }[refused_by]
  result = _cli(object_store, url, *_FLAGS, *flags, tmp_path_factory=tmp_path_factory,
                timeout=120)
  _one_line_refusal(result, says, logged=refused_by == "action")
  assert object_store.list(url) == []
  assert _as_trained(object_store.list(trained.url), trained) == trained.objects


def test_a_refused_resume_leaves_the_bucket_as_it_was(trained, object_store,
                                                      tmp_path_factory):
  """A bucket model_dir whose steps are another run's (run_id.json names another id, as
  when a run's steps are copied in): the resume is refused once the lease is held, in
  one line, and every object is as it was, the lease gone. Catches a refusal that
  removes what the path held as if it had been empty (planted: Mirror.created always
  true and api's holds_results guard dropped: the bucket path wiped) or leaves its
  lease."""
  url = object_store.new_url("run")
  _copy(object_store, trained.url, url)
  object_store.write(f"{url}/run_id.json", json.dumps({"run_id": "0" * 32}).encode())
  before = _contents(object_store, url)
  result = _cli(object_store, url, *_FLAGS, "--config.train.steps=40",
                tmp_path_factory=tmp_path_factory, timeout=120)
  _one_line_refusal(result, f"{url}/checkpoints/20 belongs to another run",
                    "(nothing was moved or deleted)")
  assert _contents(object_store, url) == before


# --- 6. Readable with plain tools --------------------------------------------------------

def test_the_bucket_export_serves_what_eval_reports(trained, object_store, tmp_path):
  """The bucket's export/20, downloaded, loads with plain TensorFlow and its
  serving_default classifies the eval split as --mode=eval scored it. Catches an export
  put incompletely (saved_model.pb without its variables) or not at all."""
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  from input_pipelines.datasets import synthetic  # pylint: disable=import-outside-toplevel
  export = _download(object_store, f"{trained.url}/export/20", tmp_path / "export")
  serve = tf.saved_model.load(export).signatures["serving_default"]
  config = _config()
  splits = synthetic.build(config.data, config.runtime.seed)
  images = tf.constant(splits.test_images[..., None].astype(np.float32) / 255.0)
  probabilities = serve(images=images)["probabilities"].numpy()
  accuracy = float(np.mean(probabilities.argmax(-1) == splits.test_labels))
  summary = json.loads(object_store.read(f"{trained.url}/summary.json"))
  assert accuracy == summary["eval_accuracy"]


def test_the_bucket_tensorboard_scalars_read_with_tensorboard(trained, object_store, tmp_path):
  """TensorBoard's own event reader, on a downloaded copy of tensorboard/train, finds the
  loss of each logged step (10, 20). Catches event files put before their last write
  (the final loop's scalars missing) or not at all."""
  from tensorboard.backend.event_processing import event_accumulator  # pylint: disable=import-outside-toplevel
  local = _download(object_store, f"{trained.url}/tensorboard", tmp_path / "tensorboard")
  accumulator = event_accumulator.EventAccumulator(
      os.path.join(local, "train"), size_guidance={event_accumulator.TENSORS: 0})
  accumulator.Reload()
  assert [event.step for event in accumulator.Tensors("loss")] == [10, 20]
  summary = json.loads(object_store.read(f"{trained.url}/summary.json"))
  last = _tensor_value(accumulator.Tensors("loss")[-1])
  assert last == pytest.approx(summary["train_loss"], rel=1e-6)


def _tensor_value(event) -> float:
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  return float(tf.make_ndarray(event.tensor_proto))
