"""Ray Train: one distloop run on N Ray workers, through Ray's `TensorflowTrainer`.

    job = ray_train.Job.from_flags(sys.argv)      # python -m trainer's flags (+ --num_workers)
    TensorflowTrainer(ray_train.train_loop, train_loop_config=job.loop_config,
                      scaling_config=ScalingConfig(num_workers=job.num_workers),
                      run_config=RunConfig(name=job.name, storage_path=job.storage_path,
                                           failure_config=FailureConfig(job.max_failures))).fit()

(examples/ray_train.py). Ray starts one worker process per worker and sets TF_CONFIG in
each (`ray.train.tensorflow.config`: a `worker` job of every worker's address, this one's
index = its world rank) before it calls `train_loop`; distloop reads everything it needs
from there, as on any TF_CONFIG cluster: the worker count, the chief (worker 0, the only
writer of model_dir), the collectives' addresses. `train_loop` is `trainer.run` under
`multi_worker_mirrored`; it talks to Ray to report (below) and to ask, at each loop
boundary, whether Ray announces a preemption (then it saves at once).

What Ray users read (Ray Train V2, the default in Ray 2.60: `Result.metrics` is the
metrics reported with the latest *checkpoint*, `Result.metrics_dataframe` one row per
reported checkpoint; metrics reported without one reach neither). Every worker calls
`ray.train.report` at the same boundaries (it is a barrier); rank 0 (the chief) attaches
a checkpoint, whose metrics are the ones Ray keeps:
- at each `checkpoint.interval` step: step, the train metrics of the loop, the eval's if
  one ran there; the pointer names the step whose save starts right after the report;
- at the end: the run's summary (summary.json's numbers), the pointer naming the final
  step (on disk: trainer.run has waited for it).
The reported checkpoint is a *pointer* (`distloop_checkpoint.json`: model_dir and step),
not the checkpoint's files: Ray refuses a reported checkpoint outside its run directory
and copies a reported directory into its storage_path, so reporting `checkpoints/<step>/`
would copy the weights and optimizer state at every report (gigabytes for a large model,
stored twice), and a Ray checkpoint on orbax's own directory would be deleted by Ray's
CheckpointConfig(num_to_keep) behind orbax's back. orbax stays the one owner of
`checkpoints/<step>/` (atomic commit, max_to_keep); `checkpoint_dir(result.checkpoint)`
resolves a pointer to the step (what plain orbax reads; its model_dir is what a resume or
--mode=eval takes), refusing one whose step is gone.

Fault tolerance is Ray's: a worker that dies (or fails) ends the group's attempt, and
Ray starts a new group (up to `FailureConfig(max_failures)` times) whose `train_loop`
resumes from the latest checkpoint in model_dir, exactly, as a rerun of the command
does. So model_dir must be on storage every Ray node sees.

Ray runs `train_loop` off the main thread, where Python cannot install signal handlers:
none is installed there (trainer/cluster/preemption.py); a stop is Ray's to decide (a
failed attempt, then a restart).
"""
import dataclasses
import functools
import inspect
import json
import os
import shutil
import sys
import tempfile
import time

from absl import logging

from trainer.errors import UserError

_MODES = ("train", "train_and_eval")  # what a Ray job runs; the others read one machine's view
_WRITER_WAIT_SECONDS = 120.0  # a restarted chief waits this long for the killed one's lock
POINTER_FILE = "distloop_checkpoint.json"  # what a reported Ray Checkpoint holds


@dataclasses.dataclass
class Job:
  """What the driver script passes to TensorflowTrainer: `loop_config` (train_loop's
  argument) and the Ray settings. Built in the driver, where bad input costs nothing."""
  loop_config: dict
  num_workers: int
  max_failures: int
  storage_path: str
  name: str

  @classmethod
  def from_flags(cls, argv: list[str]) -> "Job":
    """python -m trainer's flags (--config, --config.FIELD=VALUE, --model_dir, --mode)
    plus --num_workers, --max_failures and --storage_path, from `argv`: sys.argv
    (ml_collections reads the --config.FIELD overrides from there). Bad input: the CLI's
    one line on stderr and exit 2, before Ray starts."""
    from absl import flags  # pylint: disable=g-import-not-at-top
    from trainer.cli import main as cli  # pylint: disable=g-import-not-at-top  (its flags)
    if "num_workers" not in flags.FLAGS:
      flags.DEFINE_integer("num_workers", 2, "Ray workers, one TensorFlow worker each",
                           lower_bound=1)
      flags.DEFINE_integer("max_failures", 3, "group restarts after a failure before the job "
                           "fails (-1: no limit)", lower_bound=-1)
      flags.DEFINE_string("storage_path", None, "Ray's run storage (its results, not the "
                          "checkpoints: those are in model_dir); default: model_dir's parent")
    if os.getcwd() not in sys.path:  # plug-in modules as python -m trainer finds them
      sys.path.append(os.getcwd())
    cli.parse_flags(list(argv))  # its one-line refusals
    values = flags.FLAGS
    from trainer.store import mirror  # pylint: disable=g-import-not-at-top
    try:  # a bucket's URL, not the staging copy the CLI's flags hold (each worker stages its own)
      job = cls.of(cli.config_from_flags(), mirror.display(values.model_dir), mode=values.mode,
                   num_workers=values.num_workers, max_failures=values.max_failures,
                   storage_path=values.storage_path)
    except UserError as e:
      cli.fail(2, e)
    return job

  @classmethod
  def of(cls, config, model_dir: str, *, mode: str = "train", num_workers: int = 2,
         max_failures: int = 3, storage_path: str | None = None) -> "Job":
    """The job of `config` (a ConfigDict, a built-in name or a config file's path) in
    `model_dir`, checked here as trainer.run checks it first; UserError otherwise."""
    from input_pipelines.native_output import native_startup_silenced  # pylint: disable=g-import-not-at-top
    from trainer import api  # pylint: disable=g-import-not-at-top
    from trainer.state import config_changes  # pylint: disable=g-import-not-at-top
    from trainer.store import object_stores  # pylint: disable=g-import-not-at-top
    from trainer.store import mirror  # pylint: disable=g-import-not-at-top
    from trainer.store import model_dir as layout  # pylint: disable=g-import-not-at-top
    if mode not in _MODES:
      raise UserError(f"--mode={mode}: a Ray job trains (train, train_and_eval); run eval, "
                      f"export and continuous_eval with python -m trainer")
    config = _multi_worker(api.load_config(config))
    layout.check_location(model_dir)
    if not object_stores.is_url(model_dir):
      model_dir = os.path.abspath(model_dir)  # Ray's workers run in a directory of their own
    with native_startup_silenced():  # a plug-in module may import TensorFlow
      api.check_config(config)
    staged = mirror.staged(model_dir)  # a bucket's: checked in a local copy (each worker
    layout.check_layout(staged)        # stages its own)
    config_changes.check(staged, config.to_dict(), api.task_fields(config, None)[1])
    parent = model_dir.rstrip("/").rsplit("/", 1)[0]
    if storage_path is None:
      storage_path = parent
    if not object_stores.is_url(storage_path):
      storage_path = os.path.abspath(storage_path)
    return cls(loop_config={"config": config, "model_dir": model_dir, "mode": mode,
                            "cwd": os.getcwd(), "path": [os.getcwd(), *sys.path]},
               num_workers=num_workers, max_failures=max_failures, storage_path=storage_path,
               name=f"{model_dir.rstrip('/').rsplit('/', 1)[-1]}.ray")


def _multi_worker(config):
  """The config with runtime.strategy=multi_worker_mirrored: Ray's TF_CONFIG is a cluster
  of workers, each running the whole loop. A strategy of another kind of cluster
  (parameter servers, a TPU) cannot run there."""
  strategy = config.runtime.strategy
  if strategy in ("parameter_server", "tpu"):
    raise UserError(f"runtime.strategy={strategy}: Ray Train starts a cluster of workers "
                    f"only (multi_worker_mirrored); use trainer.launch or TF_CONFIG for it")
  if strategy == "multi_worker_mirrored":
    return config
  config = config.copy_and_resolve_references()
  config.runtime.strategy = "multi_worker_mirrored"
  return config


def train_loop(loop_config: dict) -> None:
  """Ray Train's `train_loop_per_worker`: trainer.run on this worker, reporting to Ray at
  each checkpoint.interval and at the end (module docstring). Run again by Ray after a
  failure, it resumes from the latest checkpoint in model_dir."""
  # Relative paths in the config (data files, plug-in files and modules) mean what they
  # mean for the driver, as for python -m trainer run in its directory.
  if os.path.isdir(loop_config["cwd"]):
    os.chdir(loop_config["cwd"])
  sys.path.extend([p for p in loop_config["path"] if p not in sys.path])
  # Ray sets TF_USE_LEGACY_KERAS=1 for Keras 2 (tf_keras) users; distloop is Keras 3, and a
  # plug-in reaching for tf.keras must get the Keras the model is built with.
  os.environ.pop("TF_USE_LEGACY_KERAS", None)
  import trainer  # pylint: disable=g-import-not-at-top
  model_dir, config = loop_config["model_dir"], loop_config["config"]
  index, count = worker_of(os.environ.get("TF_CONFIG", ""))
  logging.set_verbosity(logging.INFO)
  logging.info("Ray Train worker %d of %d (pid %d, TF_CONFIG from Ray)%s", index, count,
               os.getpid(), ": the chief" if index == 0 else "")
  if index == 0 and "://" not in model_dir:  # a bucket's lease waits out a dead holder itself
    wait_for_writer(model_dir)
  from ray import train as ray_train  # pylint: disable=g-import-not-at-top
  reporter = Reporter.of_ray(ray_train, model_dir)
  actions = []
  if config.checkpoint.interval:
    actions.append(trainer.Action(reporter.at_checkpoint, every_steps=config.checkpoint.interval,
                                  name="ray_report"))
  notice = getattr(ray_train, "get_preemption_info", None)  # Ray >= 2.60
  if notice is not None:
    actions.append(trainer.Action(SaveOnPreemptionNotice(notice), every_boundary=True,
                                  name="ray_preemption_notice"))
  result = trainer.run(config, model_dir, mode=loop_config["mode"], actions=actions)
  reporter.at_end(_numbers(result))


class Reporter:
  """Reports to Ray (`report(metrics, checkpoint=...)`: ray.train.report) from every
  worker, at the same steps on each (it is a barrier); rank 0 attaches the pointer
  checkpoint, so its metrics are what Ray keeps (module docstring). `report_deletes`:
  `report` uploads in the background and deletes the pointer's directory itself (Ray's
  CheckpointUploadMode.ASYNC); otherwise it has copied it when it returns.
  `checkpoint_class`: the Checkpoint `report` takes (default ray.train's; Ray Tune's
  `ray.tune.report` takes ray.tune.Checkpoint, another class under Ray Train V2)."""

  def __init__(self, report, model_dir: str, *, rank_zero: bool, report_deletes: bool = False,
               checkpoint_class=None):
    self._report = report
    self._model_dir = model_dir
    self._rank_zero = rank_zero
    self._report_deletes = report_deletes
    self._checkpoint_class = checkpoint_class

  @classmethod
  def of_ray(cls, ray_train, model_dir: str) -> "Reporter":
    """Through ray.train.report, in the background where Ray can (V2's ASYNC upload mode):
    Ray's controller takes one report per poll (every 2 s) and a synchronous report waits
    until the previous one is taken: 1.5-1.8 s of training stalled per report at a
    checkpoint every 5 steps (2 workers, 2 cores, measured); ASYNC returns once the workers
    agreed on the report: 4-40 ms each in the same job."""
    report, deletes = ray_train.report, False
    if "checkpoint_upload_mode" in inspect.signature(ray_train.report).parameters:
      report = functools.partial(ray_train.report,
                                 checkpoint_upload_mode=ray_train.CheckpointUploadMode.ASYNC)
      deletes = True  # Ray's default for ASYNC: the local directory goes once uploaded
    return cls(report, model_dir, rank_zero=ray_train.get_context().get_world_rank() == 0,
               report_deletes=deletes)

  def at_checkpoint(self, boundary) -> None:
    """An Action at each checkpoint.interval step, run before the checkpoint of that
    step starts (at the same boundary); the final step is at_end's."""
    if boundary.final:
      return
    metrics = {"step": boundary.step, **{f"train_{k}": v for k, v in boundary.train.items()
                                         if k != "examples"}}  # the loop's count: noise
    if boundary.evaluated and boundary.eval:
      metrics.update({f"eval_{k}": v for k, v in boundary.eval.items()})
    self.report(_numbers(metrics), boundary.step)

  def at_end(self, summary: dict) -> None:
    """The run's summary, with the final step's pointer (trainer.run waited for it)."""
    self.report(summary, summary.get("step"))

  def report(self, metrics: dict, step: int | None) -> None:
    if not self._rank_zero or step is None:
      self._report(metrics)
      return
    Checkpoint = self._checkpoint_class  # pylint: disable=invalid-name
    if Checkpoint is None:
      from ray.train import Checkpoint  # pylint: disable=g-import-not-at-top
    pointer = tempfile.mkdtemp(prefix="distloop_pointer_")
    try:
      from trainer.store import files  # pylint: disable=g-import-not-at-top
      files.write_text(os.path.join(pointer, POINTER_FILE),
                       json.dumps({"model_dir": self._model_dir, "step": int(step)}))
      self._report(metrics, checkpoint=Checkpoint.from_directory(pointer))
    except BaseException:
      shutil.rmtree(pointer, ignore_errors=True)
      raise
    if not self._report_deletes:
      shutil.rmtree(pointer, ignore_errors=True)


def checkpoint_dir(checkpoint) -> str:
  """The orbax checkpoint of the step a reported Ray Checkpoint (`result.checkpoint`, a
  row of `result.best_checkpoints`) names: `<model_dir>/checkpoints/<step>`, readable by
  plain orbax; its model_dir is what trainer.run(..., mode="eval") and a resume take.
  UserError if the pointer is not distloop's or the step is gone (checkpoint.max_to_keep
  removed it, or the run ended before that save was committed)."""
  from trainer.store import object_stores  # pylint: disable=g-import-not-at-top
  from trainer.store import mirror  # pylint: disable=g-import-not-at-top
  from trainer.store import model_dir as layout  # pylint: disable=g-import-not-at-top
  with checkpoint.as_directory() as directory:
    path = os.path.join(directory, POINTER_FILE)
    if not os.path.isfile(path):
      raise UserError(f"{checkpoint}: no {POINTER_FILE} in it; not a checkpoint reported by "
                      f"distloop's ray_train.train_loop")
    with open(path, encoding="utf-8") as f:
      pointer = json.load(f)
  if object_stores.is_url(pointer["model_dir"]):  # committed: its marker is in the bucket
    step_dir = f"{pointer['model_dir'].rstrip('/')}/checkpoints/{pointer['step']}"
    bucket = object_stores.open_bucket(step_dir, "a Ray checkpoint")
    present = bucket.read(f"{object_stores.parse(step_dir)[2]}/{mirror.COMMIT_MARKER}") is not None
  else:
    step_dir = os.path.join(layout.checkpoint_dir(pointer["model_dir"]), str(pointer["step"]))
    present = os.path.isdir(step_dir)
  if not present:
    raise UserError(f"{step_dir}: step {pointer['step']} of this Ray checkpoint is not on disk "
                    f"(checkpoint.max_to_keep removed it, or the run ended before it was "
                    f"committed); the model_dir's latest checkpoint is what a resume reads")
  return step_dir


class SaveOnPreemptionNotice:
  """An Action at every loop boundary: when Ray announces that a node of the group is
  about to be preempted (a spot reclaim, a drain), save this step now, once per notice,
  and train on; Ray restarts the group when the node goes, and it resumes from here.
  `notice()` is ray.train.get_preemption_info: a barrier every worker calls at every
  boundary, as every worker runs every action, so all see the same answer."""

  def __init__(self, notice):
    self._notice = notice
    self._saved_for = None

  def __call__(self, boundary) -> str | None:
    info = self._notice()
    if info is None:
      return None
    key = repr(info)
    if key == self._saved_for:
      return None
    self._saved_for = key
    logging.warning("Ray announces a preemption (%s): saving step %d now", info, boundary.step)
    return "save"


def worker_of(tf_config: str) -> tuple[int, int]:
  """(this worker's index, the worker count) of Ray's TF_CONFIG; UserError in one line
  for anything else (train_loop outside TensorflowTrainer)."""
  try:
    parsed = json.loads(tf_config)
    workers = parsed["cluster"]["worker"]
    task = parsed["task"]
    if task["type"] != "worker" or not 0 <= task["index"] < len(workers):
      raise ValueError
    return task["index"], len(workers)
  except (ValueError, KeyError, TypeError):
    raise UserError(f"train_loop runs under Ray Train's TensorflowTrainer, which sets "
                    f"TF_CONFIG to a cluster of workers; TF_CONFIG here is "
                    f"{tf_config[:200]!r}") from None


def wait_for_writer(model_dir: str, seconds: float = _WRITER_WAIT_SECONDS) -> None:
  """Waits until no process holds model_dir's writer lock. After a failure Ray kills the
  old group and starts a new one without waiting for the old processes to be gone: the
  old chief may still hold the lock for a moment (the kernel drops it when it dies)."""
  from trainer.store import files  # pylint: disable=g-import-not-at-top
  from trainer.store import model_dir as layout  # pylint: disable=g-import-not-at-top
  deadline = time.monotonic() + seconds
  said = False
  while files.held(layout.lock_path(model_dir)):
    if time.monotonic() > deadline:
      return  # acquire refuses it, naming the holder
    if not said:
      logging.info("waiting for the writer lock of %s (a previous attempt's chief "
                   "still ending?)", model_dir)
      said = True
    time.sleep(0.5)


def _numbers(result) -> dict:
  """The summary's numbers (Ray's metrics), or the run's other result as a value."""
  if not isinstance(result, dict):
    return {"result": str(result)}
  return {key: value for key, value in result.items()
          if isinstance(value, (int, float, str, bool)) or value is None}
