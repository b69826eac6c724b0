"""The trained runs the checks share: each (workload, shape) is trained once per session.

A shape is how a run is laid out (`SHAPES`): its replica count and strategy, or the whole
step compiled by XLA; a check names the shapes it runs on.
`runs.uninterrupted(name, shape)` -> (model_dir, summary): trained to the end
(eval, export, summary.json), every 10th step kept. `runs.interrupted(name, shape)`
-> Interrupted: the same run SIGTERMed at step 5 (exit 42), resumed and SIGKILLed at
step 35, resumed again to the end; one model_dir, three processes, both resume checks.
On a bucket (`runs.interrupted(name, shape, store)`: STORAGES, an emulated object store
of tests/support/object_stores.py) the interrupted run is the same three processes with
--model_dir=<a new bucket>, the SIGKILL timed to cut the upload of a step short, and
its model_dir is the bucket's, downloaded once the run is done: the checks read it as
they read a local one.
`runs.sgd(name, shape)`: the uninterrupted run, or with the workload's `sgd_flags`.
These two are trained once for all of pytest-xdist's workers (other workers' checks read
them too); the rest once per worker, by the one group of cells that reads them.
`runs.changed(name, shape)` -> Changed: the uninterrupted run as of step 20, then the fields
a resume may change changed (catalogue.CHANGES), to the end in one process and SIGTERMed +
resumed.
`runs.elastic(name, shape)` -> Elastic: a copy of the `sgd` run of `shape` as it was at
step 20 (no new training), resumed on 1 replica.
Every run of a workload that evaluates does so every 10 steps (train_and_eval), logged in
metrics.csv (`eval_rows`).
Weights are read in this process with plain orbax (`arrays`).
"""
import csv
import dataclasses
import fcntl
import hashlib
import json
import os
import pathlib
import re
import shutil
import signal
import time

import pytest

from trainer.loop import digests as digests_module
from trainer.verify.checks import copy_as_of
from tests.support.cli import run_trainer
from tests.guarantees import catalogue
from tests.support.processes import TrainerProcess
from tests.support.processes import read_checkpoint as arrays  # noqa: F401  (test_matrix reads it here)

# Default threading, as users run it: every run is deterministic (catalogue.COMMON), which
# fixes the threads per op whatever the replicas or cores (trainer/cluster/runtime.py).
# Every run records its variables' digests at each loop boundary, as `python -m
# trainer.verify`'s runs do (trainer/loop/digests.py): the resume checks judge with verify.
ENV: dict = {digests_module.ENV: "1"}
TIMEOUT = 300


@dataclasses.dataclass(frozen=True)
class Shape:
  replicas: int
  flags: tuple[str, ...] = ()


# The layouts every workload runs on, each a few flags a user would type. "1" is the
# reference the others must agree with under plain SGD.
SHAPES = {
    "1": Shape(1),
    "2": Shape(2, ("--config.runtime.strategy=mirrored", "--config.runtime.num_cpu_devices=2")),
    # One copy of every variable on the host, the replicas' gradients summed into it
    # (a variable each replica assigns takes the first replica's assignment).
    "central_storage-2": Shape(2, ("--config.runtime.strategy=central_storage",
                                   "--config.runtime.num_cpu_devices=2")),
    # The whole step (forward, backward, update) one XLA cluster. Not under op determinism
    # (refused for a MaxPool model: XLA has no deterministic MaxPool gradient); one thread
    # per op, as deterministic runs take, keeps the summation order.
    "xla-1": Shape(1, ("--config.runtime.jit_compile=true",
                       "--config.runtime.deterministic=false",
                       "--config.runtime.intra_op_threads=1")),
}


# CI's time (the whole .ci/run within its budget on the 2-core machine): some cells run on
# the workloads whose code they change, not on all 14 (DISTLOOP_FULL_MATRIX=1 runs every
# cell; the cells left out are skipped, with SAMPLED_OUT). A key is (check, shape), "*" for
# every check of that shape. Every workload still resumes (SIGTERM, SIGKILL) on 1 replica,
# and every shape runs every check on some workloads.
# - central_storage-2: its first-replica rule (dropout_mlp), statistics (conv_batchnorm),
#   optimizer state and EMA, two optimizers, a Task's state; xla-1: the same, and batches of
#   varying length (a retrace per shape).
# - The resumes on 2 replicas: state or data that differ per replica (random layers,
#   BatchNorm statistics, synchronized or not, slots, EMA and accumulators, two optimizers,
#   a Task's variables, padded lengths per replica); the other 7 resume on 1 replica, where
#   the same checkpoint code saves the same variables.
# - The summation order: a convolution, a recurrent layer's loop, a Task's two models, a
#   synchronized BatchNorm (the same thread setting decides every one of their sums).
# - A resume with changed fields: every input pipeline (fixed, augmented, variable-length
#   streams, a Task's data), the optimizer state and a Task's, and a refusal; the five left
#   out read the synthetic data as cnn does.
FULL_MATRIX = os.environ.get("DISTLOOP_FULL_MATRIX") == "1"
_STATE_AND_DATA = ("dropout_mlp", "conv_batchnorm", "conv_batchnorm_synchronized",
                   "adamw_ema_accumulation", "gan", "task_counter", "variable_length")
SAMPLED = {
    ("*", "central_storage-2"): ("cnn", "dropout_mlp", "conv_batchnorm",
                                 "adamw_ema_accumulation", "gan", "task_counter"),
    ("*", "xla-1"): ("cnn", "conv_batchnorm", "adamw_ema_accumulation", "gan", "task_counter",
                     "variable_length"),
    ("sigterm", "2"): _STATE_AND_DATA,
    ("sigkill", "2"): _STATE_AND_DATA,
    ("order", "one_device-of-2"): ("cnn", "conv_batchnorm_synchronized", "gan",
                                   "variable_length_gru"),
    ("resume_changed", "1"): ("cnn", "augmented", "adamw_ema_accumulation", "contrastive",
                              "gan", "task_counter", "task_layer_generator", "variable_length",
                              "variable_length_gru"),
}
SAMPLED_OUT = ("sampled for CI's time (tests/guarantees/conftest.py SAMPLED); "
               "DISTLOOP_FULL_MATRIX=1 runs every cell")


def sampled_out(check: str, workload_name: str, shape: str) -> bool:
  if FULL_MATRIX:
    return False
  kept = SAMPLED.get((check, shape), SAMPLED.get(("*", shape)))
  return kept is not None and workload_name not in kept


# Layouts that must sum in exactly the order of "1" (checked bit for bit, by
# test_matrix's `order` check only): one replica in a process of 2 logical devices. Under
# runtime.deterministic the threads per op are the config's, never the device count's
# (trainer/cluster/runtime.py threads_per_op_for), so this is "1" to the last bit: a
# summation order that followed the shape would change it, while staying within the
# rounding the 2-replica shapes have anyway (measured: 4.5e-8 against 3.0e-8).
ORDER_SHAPES = {
    "one_device-of-2": Shape(1, ("--config.runtime.strategy=one_device",
                                 "--config.runtime.num_cpu_devices=2")),
}


# Where a run's model_dir lives: "local" (a directory: every check, every shape), or a
# bucket, the same run with --model_dir=gs://... or s3://... (tests/support/object_stores.py's
# emulators, one per pytest process: a bucket run is read by its own cells only, one
# xdist group, tests/conftest.py): BUCKET_WORKLOADS on BUCKET_SHAPES, the checks of
# BUCKET_CHECKS, each against the same workload on local disk.
STORAGES = ("local", "gs", "s3")
BUCKET_EMULATORS = {"gs": "gcs_session_emulator", "s3": "s3_session_emulator"}
BUCKET_SHAPES = ("1",)
# The built-in step and variable-length batches (a Task, contrastive, adds variables to the
# same checkpoint files: on a bucket with DISTLOOP_FULL_MATRIX=1).
BUCKET_WORKLOADS = ("cnn", "variable_length") + (("contrastive",) if FULL_MATRIX else ())
BUCKET_CHECKS = ("sigterm", "sigkill", "eval", "export")
# The rerun after a SIGKILL waits out the dead holder's writer lease (trainer/store/lease.py):
# 2 s, not the default 60.
BUCKET_FLAGS = ("--config.checkpoint.lease_seconds=2",)
# The interrupted run's three processes report to a user's tracker too (it cannot delete a
# step: trainer/reporters/fan_out.py hands it each step once), which notes every call in
# `tracker_calls(model_dir)`, beside the model_dir.
TRACKER_FLAGS = ("--config.runtime.loggers=tensorboard,csv,tests.plugins.trackers:Recorder",)
# The step whose upload the SIGKILL cuts short on a bucket (steps 30-35 on disk).
KILLED_UPLOAD = 30


def flags(workload, shape: str, *extra: str) -> list[str]:
  layout = SHAPES[shape] if shape in SHAPES else ORDER_SHAPES[shape]
  evals = catalogue.EVALS if workload.evaluates else ()
  return [*workload.flags, *catalogue.COMMON, *evals, *layout.flags, *extra]


def trainer_run(model_dir, *args: str, env: dict | None = None):
  return run_trainer(model_dir, *args, timeout=TIMEOUT, env={**ENV, **(env or {})})


def complete_steps(model_dir) -> list[int]:
  directory = os.path.join(str(model_dir), "checkpoints")
  return sorted(int(name) for name in os.listdir(directory) if name.isdigit())


def committed_steps(store, url: str) -> list[int]:
  """The steps of a bucket model_dir that count: those whose commit marker is there
  (trainer/store/mirror.py writes it after the step's files)."""
  return sorted(int(name.split("/")[0]) for name in store.list(f"{url}/checkpoints")
                if re.fullmatch(r"\d+/commit_success\.txt", name))


def download(store, url: str, destination) -> None:
  """Every object of the bucket model_dir `url` into `destination`, as files (read past
  the proxy): the checks then read it as a model_dir on disk."""
  for name in store.list(url):
    path = os.path.join(str(destination), *name.split("/"))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
      f.write(store.read(f"{url}/{name}"))


def _kill_mid_upload(store, url: str, process) -> None:
  """SIGKILLs `process` while it uploads the step directory `url`, after its first objects
  and before its last, where the store lets a test choose the moment: on s3:// the proxy
  answers the step's model/ objects 503 (the client retries) and the kill comes at the
  first such answer (or at once if the step was all uploaded before); on gs://, whose
  uploads name their object in the body only, it comes once the bucket holds the step's
  first object (polled past the proxy: 1-3 of its ~20 objects were there, measured)."""
  deadline = time.monotonic() + 60

  def waiting(until) -> None:
    while not until():
      assert process.process.poll() is None, (f"ended while {url} was uploaded:\n"
                                              f"{process.output[-3000:]}")
      assert time.monotonic() < deadline, f"{url}: not uploaded in 60 s"
      time.sleep(0.005)

  if store.scheme != "s3":
    waiting(lambda: store.list(url))
    process.send(signal.SIGKILL)
    return
  bucket, name = store.split(url)
  faults = store.proxy.faults
  store.proxy.deny(status=503, match=f"PUT /{bucket}/{name}/model/")
  try:
    waiting(lambda: store.proxy.faults > faults or "commit_success.txt" in store.list(url))
    process.send(signal.SIGKILL)
    process.process.wait(timeout=TIMEOUT)  # dead before its retries pass the proxy again
  finally:
    store.proxy.passthrough()


@dataclasses.dataclass
class Interrupted:
  model_dir: object
  stopped_at: int    # the step SIGTERM saved (exit 42)
  killed_after: int  # the step logged when SIGKILL came
  restored: int      # the step the run after SIGKILL resumed from
  url: str | None = None  # on a bucket: its URL (model_dir is then its download)


@dataclasses.dataclass
class Changed:
  """resume_changed: step 20 of the uninterrupted run, then the workload's `changed_flags()`
  to the end: `reference` goes on in one process, `resumed` is SIGTERMed after the change (at
  `stopped_at`) and resumed. `refusal`: the run with the change, when the workload
  refuses it (the rest None)."""
  reference: object = None
  resumed: object = None
  stopped_at: int = 0
  refusal: object = None


@dataclasses.dataclass
class Elastic:
  """elastic: `model_dir`, a copy of a run as it was at catalogue.ELASTIC_AT (`before`: its
  files' digests then), resumed on 1 replica by `result` (to the end, or refused)."""
  model_dir: object
  before: dict
  result: object


def digests(model_dir) -> dict:
  """{path in model_dir: sha256 of its bytes} of every file: what a refusal must not change."""
  found = {}
  for directory, _, names in os.walk(str(model_dir)):
    for name in names:
      path = os.path.join(directory, name)
      with open(path, "rb") as f:
        found[os.path.relpath(path, str(model_dir))] = hashlib.sha256(f.read()).hexdigest()
  return found


class Runs:

  def __init__(self, tmp_path_factory):
    self._factory = tmp_path_factory
    self._cache = {}
    # The session's folder, which pytest-xdist's workers share (each has its own under it).
    base = tmp_path_factory.getbasetemp()
    self._shared_root = os.path.join(
        str(base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base), "shared_runs")
    os.makedirs(self._shared_root, exist_ok=True)

  def _once(self, key, make):
    """make() once per session; a failure too is kept, and fails every check that needs it."""
    if key not in self._cache:
      try:
        self._cache[key] = make()
      except BaseException as e:  # pylint: disable=broad-except
        self._cache[key] = e
        raise
    if isinstance(self._cache[key], BaseException):
      raise AssertionError(f"{key} failed earlier in this session") from self._cache[key]
    return self._cache[key]

  def _dir(self, *parts):
    return self._factory.mktemp("_".join(str(part) for part in parts))

  def _shared(self, key, train) -> pathlib.Path:
    """The model_dir `train(model_dir)` trained, once per session for all of pytest-xdist's
    workers: a run that the checks of other groups read too (`shapes_agree` and `order`
    read the run of 1 replica, `refused` another workload's; a group runs on one worker,
    tests/conftest.py), which each worker trained again before (~1 run per workload). The
    first worker trains it under a lock the others wait on; a failure leaves no ".done"."""
    def make():
      model_dir = os.path.join(self._shared_root, "_".join(str(part) for part in key))
      with open(model_dir + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released as the file closes
        if not os.path.exists(model_dir + ".done"):
          shutil.rmtree(model_dir, ignore_errors=True)  # what a failed attempt left
          os.makedirs(model_dir)
          train(model_dir)
          with open(model_dir + ".done", "w"):
            pass
      return pathlib.Path(model_dir)
    return self._once(key, make)

  def uninterrupted(self, name: str, shape: str):
    def train(model_dir):
      result = trainer_run(model_dir, *flags(catalogue.BY_NAME[name], shape))
      assert result.returncode == 0, f"exit {result.returncode}\n{result.stderr[-4000:]}"
    model_dir = self._shared(("uninterrupted", name, shape), train)
    with open(os.path.join(model_dir, "summary.json")) as f:
      summary = json.load(f)
    assert summary["step"] == catalogue.STEPS, summary
    assert summary["num_replicas"] == {**SHAPES, **ORDER_SHAPES}[shape].replicas, summary
    return model_dir, summary

  def sgd(self, name: str, shape: str):
    workload = catalogue.BY_NAME[name]
    if not workload.sgd_flags:
      return self.uninterrupted(name, shape)[0]

    def train(model_dir):
      result = trainer_run(model_dir, *flags(workload, shape, *workload.sgd_flags))
      assert result.returncode == 0, f"exit {result.returncode}\n{result.stderr[-4000:]}"
    return self._shared(("sgd", name, shape), train)

  def interrupted(self, name: str, shape: str, store=None) -> Interrupted:
    """On local disk, or on a new bucket of `store` (an emulated object store): then the
    SIGKILL comes once step 35 is logged and the upload of step KILLED_UPLOAD has begun
    (a kill between a step's first object and its commit marker, most of the time), the
    rerun must take the dead holder's lease over (one line), restore the newest step whose
    marker is in the bucket and set nothing aside (checkpoints_corrupt/), and `model_dir`
    is the bucket's model_dir, downloaded at the end."""
    storage = store.scheme if store is not None else "local"

    def make():
      workload = catalogue.BY_NAME[name]
      if store is None:
        model_dir = target = self._dir(name, shape, "interrupted")
        args, env = flags(workload, shape, *TRACKER_FLAGS), {}
      else:
        model_dir = self._dir(name, shape, storage, "interrupted")  # the download
        target = store.new_url(f"{name}-{shape}")
        args, env = flags(workload, shape, *BUCKET_FLAGS, *TRACKER_FLAGS), dict(store.env)
      env["DISTLOOP_TRACKER_CALLS"] = tracker_calls(model_dir)
      stopped = TrainerProcess(target, *args, env={**ENV, **(env or {})})
      code = stopped.stop_at(rf"step 5/{catalogue.STEPS}", timeout=TIMEOUT)
      assert code == 42, f"SIGTERM: exit {code}\n{stopped.output[-3000:]}"
      stopped_at = int(re.search(r"preempted at step (\d+)", stopped.output).group(1))

      killed = TrainerProcess(target, *args, env={**ENV, **(env or {})})
      try:
        killed.wait_for(rf"step 35/{catalogue.STEPS}", timeout=TIMEOUT)
        if store is None:
          killed.send(signal.SIGKILL)
        else:
          _kill_mid_upload(store, f"{target}/checkpoints/{KILLED_UPLOAD}", killed)
        assert killed.wait(timeout=TIMEOUT) == -signal.SIGKILL, killed.output[-3000:]
      finally:
        killed.kill()
      assert f"Restored checkpoint at step {stopped_at}" in killed.output, killed.output[-3000:]
      on_disk = complete_steps(model_dir) if store is None else committed_steps(store, target)

      resumed = trainer_run(target, *args, env=env)
      assert resumed.returncode == 0, f"exit {resumed.returncode}\n{resumed.stderr[-4000:]}"
      restored = int(re.search(r"Restored checkpoint at step (\d+)", resumed.stderr).group(1))
      assert restored == on_disk[-1], (restored, on_disk)  # the newest complete step
      if store is not None:
        took_over = [line for line in resumed.stderr.splitlines()
                     if "Took over the writer lease" in line]
        assert len(took_over) == 1, resumed.stderr[-4000:]
        set_aside = store.list(f"{target}/checkpoints_corrupt")
        assert not set_aside, f"the rerun set aside {set_aside}\n{resumed.stderr[-4000:]}"
        download(store, target, model_dir)
      return Interrupted(model_dir, stopped_at, 35, restored,
                         url=target if store is not None else None)
    key = ("interrupted", name, shape) if store is None else ("interrupted", name, shape, storage)
    return self._once(key, make)

  def changed(self, name: str, shape: str) -> "Changed":
    def make():
      workload = catalogue.BY_NAME[name]
      args = flags(workload, shape)
      # The uninterrupted run as of step 20 (constant learning rate: train.steps changes
      # nothing before it), not a process of its own that trains 20 steps again.
      first = self.uninterrupted(name, shape)[0]
      reference, resumed = self._dir(name, shape, "changed"), self._dir(name, shape, "resumed")
      for copy in (reference, resumed):
        copy_as_of(first, copy, catalogue.CHANGED_AT)
      changed_args = [*args, *workload.changed_flags()]
      result = trainer_run(reference, *changed_args)
      if workload.refuses_change:
        return Changed(refusal=result)
      assert result.returncode == 0, f"exit {result.returncode}\n{result.stderr[-4000:]}"
      stopped = TrainerProcess(resumed, *changed_args, env=ENV)
      code = stopped.stop_at(rf"step (2[4-9]|3\d)/{catalogue.STEPS}", timeout=TIMEOUT)
      assert code == 42, f"SIGTERM: exit {code}\n{stopped.output[-3000:]}"
      stopped_at = int(re.search(r"preempted at step (\d+)", stopped.output).group(1))
      result = trainer_run(resumed, *changed_args)
      assert result.returncode == 0, f"exit {result.returncode}\n{result.stderr[-4000:]}"
      assert f"Restored checkpoint at step {stopped_at}" in result.stderr, result.stderr[-3000:]
      return Changed(reference, resumed, stopped_at)
    return self._once(("changed", name, shape), make)

  def elastic(self, name: str, shape: str) -> Elastic:
    def make():
      workload = catalogue.BY_NAME[name]
      model_dir = self._dir(name, shape, "elastic")
      copy_as_of(self.sgd(name, shape), model_dir, catalogue.ELASTIC_AT)
      before = digests(model_dir)
      # --mode=train: the weights are the check, the evals of the rest cost time only
      # (not where they set the learning rate: train.lr_on_plateau, cnn's)
      plateau = any(flag.startswith("--config.train.lr_on_plateau.factor=")
                    for flag in workload.flags)
      result = trainer_run(model_dir, *flags(workload, "1", *workload.sgd_flags),
                           *(() if plateau else ("--mode=train",)))
      return Elastic(model_dir, before, result)
    return self._once(("elastic", name, shape), make)


def tracker_calls(model_dir) -> str:
  return f"{model_dir}.tracker.jsonl"


def train_rows(model_dir) -> dict:
  """metrics.csv's train values: {(step, name): value}."""
  with open(os.path.join(str(model_dir), "metrics.csv"), newline="") as f:
    return {(int(row["step"]), row["name"]): float(row["value"])
            for row in csv.DictReader(f) if row["split"] == "train"}


def eval_rows(model_dir) -> dict:
  """metrics.csv's eval values: {(step, name): value} (each step logged once, by the
  process that ran it: a resume drops the rows past the step it restored)."""
  with open(os.path.join(str(model_dir), "metrics.csv"), newline="") as f:
    return {(int(row["step"]), row["name"]): float(row["value"])
            for row in csv.DictReader(f) if row["split"] == "eval"}


@pytest.fixture(scope="session")
def runs(tmp_path_factory):
  return Runs(tmp_path_factory)


@pytest.fixture
def store(request, storage):
  """The emulated object store of a cell's `storage` (tests/support/object_stores.py, one per
  pytest process), passing everything through; None for local disk."""
  if storage == "local":
    return None
  emulator = request.getfixturevalue(BUCKET_EMULATORS[storage])
  emulator.proxy.passthrough()
  return emulator
