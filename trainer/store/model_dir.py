"""The layout of model_dir, and atomic JSON files in it.

  checkpoints/<step>/   orbax (trainer/state/checkpoints.py)
  checkpoints_best/<step>/   the best by eval accuracy (checkpoint.keep_best)
  checkpoints_corrupt/<step>.<time>/   unreadable steps, set aside
  tensorboard/{train,eval}/
  export/<step>/        SavedModel (trainer/state/export.py)
  config.json           the resolved config of the last run started here
  config_history/<UTC time>_step<N>.json   every config a run started with, from step N
                        (a new entry only when it differs from the previous one)
  run_id.json           {"run_id": a uuid4}: which run this model_dir holds, written once by
                        the chief when a run first starts here (a warm start included: a new
                        run); every checkpoint step's meta names its run too, and a step of
                        another run is refused (trainer/state/config_changes.py: check_run)
  summary.json          written when a run finishes
  finished.json         written by the chief last, when training ended: {"step": the final
                        step, "train_steps": the run's train.steps, "reason": "train.steps"
                        or "stopped by <action>" (an Action's "stop", early_stop), with
                        ": <why>" where a trainer.Stop gave a reason};
                        removed when a run trains here again. What every waiter reads
                        (continuous_eval, the evaluator task: the final step is this one);
                        one that cannot be parsed, or whose step has no checkpoint, is
                        refused (exit 2: `finished_record`)
  reporters.json        {tracker: {"run": its run id, "train": step, "eval": step}}: the
                        highest step each tracker that cannot delete (MLflow, W&B, a user's)
                        was handed, so that no step reaches it twice (trainer/reporters/fan_out.py)
  mlflow_run.json, wandb_run.json   the tracker run a resumed run logs on into
  .lock                 held by the writing trainer (trainer/store/writer_lock.py)

A model_dir on a bucket (`gs://`, `s3://`) has this layout too, in objects: the run
works in a local staging copy and trainer/store/mirror.py puts each finished piece in
the bucket (a checkpoint step counts once its `commit_success.txt` is there); the
lock is a lease (trainer/store/lease.py). `check_location` refuses other schemes.
`check_layout` refuses (exit 2, before anything is written) a model_dir where one
of these paths is something else (`checkpoints` a file, `.lock` a directory, a
symbolic link loop); `check_writable` finds a read-only directory at start-up (exit 2,
as the writer lock finds a model_dir that cannot be created or written at all), not at
the first save after the training.
"""
import copy
import json
import os
import tempfile
import time


from trainer.store import files
from trainer.store import mirror
from trainer.store import object_stores
from trainer.store import storage
from trainer.errors import StorageError, UserError

LOCK_NAME = ".lock"
_DIRECTORIES = ("checkpoints", "checkpoints_best", "checkpoints_corrupt", "tensorboard", "export",
                "config_history")
_FILES = ("config.json", "run_id.json", "summary.json", "finished.json", "metrics.csv",
          "mlflow_run.json", "wandb_run.json", "reporters.json", LOCK_NAME)
_WRITTEN_DIRECTORIES = ("checkpoints", "checkpoints_best", "tensorboard", "export",
                        "config_history")


def check_location(path: str, what: str = "--model_dir") -> None:
  """UserError for a URL distloop cannot write: a scheme other than gs:// and s3://
  (`hdfs://`, `az://`; a plain os.makedirs would create a local directory named
  `hdfs:`), or no bucket name. gs:// and s3:// are staged (trainer/store/mirror.py)."""
  if object_stores.is_url(path):
    object_stores.parse(path, what)


def check_init_from(checkpoint_config) -> None:
  """checkpoint.init_from (a warm start, trainer/state/train_state.py): a model_dir, its
  checkpoints/ or one step of them, on disk or in a bucket (staged here)."""
  init_from = checkpoint_config.init_from
  if not init_from:
    return
  check_location(init_from, "checkpoint.init_from")
  if not os.path.isdir(mirror.staged_checkpoints(init_from, "checkpoint.init_from")):
    raise UserError(f"checkpoint.init_from={init_from!r} is not a directory")


def check_layout(model_dir: str) -> None:
  """UserError unless model_dir is a directory (or can be made one) whose distloop
  paths are what they must be."""
  try:
    os.stat(model_dir)
  except FileNotFoundError:
    if os.path.islink(model_dir):
      raise UserError(f"--model_dir={model_dir} is a symbolic link to "
                      f"{os.readlink(model_dir)!r}, which does not exist: create that "
                      f"directory, or use another --model_dir") from None
    return  # the run creates it
  except OSError as e:  # ELOOP (a symbolic link loop), ENOTDIR (a parent is a file), EACCES
    raise UserError(f"--model_dir={model_dir} cannot be used: {e.strerror}; use another "
                    f"--model_dir") from None
  if not os.path.isdir(model_dir):
    raise UserError(f"--model_dir={model_dir} exists and is not a directory")
  for name in _DIRECTORIES:
    path = os.path.join(model_dir, name)
    if os.path.lexists(path) and not os.path.isdir(path):
      raise UserError(f"{path} is not a directory: distloop keeps its {name} there; move it "
                      f"away, or use another --model_dir")
  for name in _FILES:
    path = os.path.join(model_dir, name)
    if os.path.lexists(path) and not os.path.isfile(path):
      raise UserError(f"{path} is not a regular file (distloop writes its {name} there); "
                      f"move it away, or use another --model_dir")


def check_writable(model_dir: str) -> None:
  """UserError (exit 2: a read-only or denied directory, storage.start_up_failure) or
  StorageError (exit 1: a full or sick disk) unless model_dir and each directory the run
  writes that already exists take a new entry: a real probe (a directory created and
  removed), as permission bits say nothing to root and nothing about a read-only mount."""
  for directory in (model_dir, *(os.path.join(model_dir, name) for name in _WRITTEN_DIRECTORIES)):
    if not os.path.isdir(directory):
      continue
    try:
      os.rmdir(tempfile.mkdtemp(prefix=".distloop-probe-", dir=directory))
    except OSError as e:
      refusal = storage.start_up_failure("files", directory, e)
      if isinstance(refusal, StorageError):
        raise StorageError(f"{refusal}; found at start-up: nothing was trained (make room, "
                           f"or use another --model_dir)") from None
      raise refusal from None


def holds_results(model_dir: str) -> bool:
  """Whether model_dir holds a checkpoint, an export or a summary: work to keep."""
  for name in ("checkpoints", "checkpoints_best", "export"):
    try:
      if os.listdir(os.path.join(model_dir, name)):
        return True
    except OSError:
      pass
  return os.path.lexists(summary_path(model_dir))


def checkpoint_dir(model_dir: str) -> str:
  return os.path.join(model_dir, "checkpoints")


def checkpoint_steps(model_dir: str) -> list[int]:
  """The steps under checkpoints/ (folders named by a number), oldest first."""
  try:
    names = os.listdir(checkpoint_dir(model_dir))
  except OSError:
    return []
  return sorted(int(name) for name in names if name.isdigit())


_METAS: dict = {}  # (path, mtime, size) -> meta: step_meta's reads


def step_meta(model_dir: str, step: int) -> dict | None:
  """The meta of checkpoints/<step> (orbax's JsonSave of `<step>/meta/metadata`), read as
  plain JSON once per process (again only if the file changed: a step set aside and
  saved anew); None if it cannot be read."""
  path = os.path.join(checkpoint_dir(model_dir), str(step), "meta", "metadata")
  try:
    info = os.stat(path)
  except OSError:
    return None
  key = (os.path.abspath(path), info.st_mtime_ns, info.st_size)
  if key not in _METAS:
    meta = files.read_json(path)
    _METAS[key] = meta if isinstance(meta, dict) else None
  return copy.deepcopy(_METAS[key])  # the caller's to change


def steps_with_meta(model_dir: str) -> list[tuple[int, dict | None]]:
  """The index of the checkpoint steps their readers share (the resume's checks of the
  config, the run id and the shape; the newest data position): (step, its meta or None
  if unreadable), newest first."""
  return [(step, step_meta(model_dir, step)) for step in reversed(checkpoint_steps(model_dir))]


def newest_data_position(model_dir: str, at_most: int | None = None) -> tuple[int, int] | None:
  """(step, examples used) of the newest checkpoint (at or before step `at_most`, if
  given) whose meta reads, else None.

  Read as plain JSON (`<step>/meta/metadata`, orbax's JsonSave) before the runtime
  starts: train.epochs' steps are counted from this data position. Only the restore
  proves a step readable, so this is what a resume should find; the Trainer refuses
  a run whose restored position makes other steps (trainer/setup/epochs.py)."""
  for step, meta in steps_with_meta(model_dir):
    if at_most is not None and step > at_most:
      continue
    if meta is not None and isinstance(meta.get("examples_consumed"), int):
      return step, meta["examples_consumed"]
  return None


def best_checkpoint_dir(model_dir: str) -> str:
  return os.path.join(model_dir, "checkpoints_best")


def corrupt_checkpoint_dir(model_dir: str) -> str:
  return os.path.join(model_dir, "checkpoints_corrupt")


def export_dir(model_dir: str, step: int) -> str:
  return os.path.join(model_dir, "export", str(step))


def predictions_dir(model_dir: str, step: int) -> str:
  return os.path.join(model_dir, "predictions", str(step))


def tensorboard_dir(model_dir: str) -> str:
  return os.path.join(model_dir, "tensorboard")


def lock_path(model_dir: str) -> str:
  return os.path.join(model_dir, LOCK_NAME)


def summary_path(model_dir: str) -> str:
  return os.path.join(model_dir, "summary.json")


def finished_path(model_dir: str) -> str:
  return os.path.join(model_dir, "finished.json")


def write_finished(model_dir: str, step: int, train_steps: int, *,
                   stopped_by: str | None = None, why: str | None = None) -> None:
  """The run ended at `step` (the last write of a finished run); `why`: the reason a
  trainer.Stop gave."""
  reason = f"stopped by {stopped_by}" if stopped_by else "train.steps"
  files.write_json(finished_path(model_dir), {
      "step": step, "train_steps": train_steps,
      "reason": f"{reason}: {why}" if why else reason})


def clear_finished(model_dir: str) -> None:
  try:
    os.remove(finished_path(model_dir))
  except FileNotFoundError:
    return
  bucket = mirror.of(model_dir)
  if bucket is not None:
    bucket.remove(finished_path(model_dir))


def final_step(model_dir: str, train_steps: int) -> int | None:
  """The step a run to `train_steps` ended at, if finished.json says it ended (an early
  stop ends below train_steps; a record of a run to other train.steps is not this run's
  unless it reached them). UserError for a broken finished.json (`finished_record`)."""
  record = finished_record(model_dir)
  if record is None:
    return None
  if record["step"] >= train_steps or record.get("train_steps") == train_steps:
    return record["step"]
  return None


def finished_record(model_dir: str) -> dict | None:
  """finished.json's record ({"step": int, ...}), or None where there is none.

  It says where training ended, so it decides when continuous_eval and the evaluator
  task stop waiting and whether a rerun is already finished. One that cannot be parsed,
  or whose step has no checkpoint on disk (nor one distloop set aside as unreadable:
  then the run is no longer finished), was not written so by distloop (an edit, a
  corruption): ignoring it was silent (a sidecar waiting out eval.timeout_seconds, an
  hour, for a step that never comes; a rerun training on past an early stop), and so
  would be guessing. Refused instead: UserError (exit 2), one line naming the file and
  what is wrong."""
  path = finished_path(model_dir)
  for _ in range(2):
    try:
      with open(path, "rb") as f:
        raw = f.read()
    except FileNotFoundError:
      return None
    except OSError as e:
      raise UserError(f"{path} cannot be read ({e.strerror}); {_FINISHED_ADVICE}") from None
    try:
      record = json.loads(raw.decode("utf-8"))
    except ValueError as e:  # UnicodeDecodeError included
      raise UserError(f"{path} is not JSON ({e}); {_FINISHED_ADVICE}") from None
    step = record.get("step") if isinstance(record, dict) else None
    if (not isinstance(step, int) or isinstance(step, bool) or step < 0
        or not isinstance(record.get("train_steps", 0), int)):
      raise UserError(f"{path} holds no integer \"step\" and \"train_steps\" "
                      f"({raw[:80].decode('utf-8', 'replace')!r}); {_FINISHED_ADVICE}")
    if os.path.isdir(os.path.join(checkpoint_dir(model_dir), str(step))):
      return record
    if any(name.split(".")[0] == str(step)
           for name in _listdir(corrupt_checkpoint_dir(model_dir))):
      return None  # its step proved unreadable and was set aside: training is not finished
    # A rerun clears finished.json before it trains on (and retention removes the step):
    # read again, so a record replaced meanwhile is not refused.
  on_disk = sorted(int(name) for name in _listdir(checkpoint_dir(model_dir)) if name.isdigit())
  present = (f"the checkpoints there are of step(s) {', '.join(map(str, on_disk[-5:]))}"
             if on_disk else "there is no checkpoint")
  raise UserError(f"{path} says training ended at step {step}, but "
                  f"{os.path.join(checkpoint_dir(model_dir), str(step))} is not on disk "
                  f"({present}); {_FINISHED_ADVICE}")


_FINISHED_ADVICE = ("it records where training ended, so it is not guessed: put back the one "
                    "the finished run wrote, or remove it (training then goes on to "
                    "train.steps, and continuous_eval waits for that step)")


def _listdir(directory: str) -> list[str]:
  try:
    return os.listdir(directory)
  except OSError:
    return []


def metrics_csv_path(model_dir: str) -> str:
  return os.path.join(model_dir, "metrics.csv")


def reporters_path(model_dir: str) -> str:
  return os.path.join(model_dir, "reporters.json")


def config_path(model_dir: str) -> str:
  return os.path.join(model_dir, "config.json")


def mismatch_advice(model_dir: str, *, training: bool) -> str:
  """What to do when model_dir's checkpoints are another model's than this config's."""
  recorded = config_path(model_dir)
  if not os.path.isfile(recorded):
    return "use another --model_dir"
  if training:
    return (f"this model_dir was trained with {recorded}: omit --config to resume with it, "
            f"or use another --model_dir")
  return (f"this model_dir was trained with {recorded}: omit --config, or pass "
          f"--config={recorded}")


def run_id_path(model_dir: str) -> str:
  return os.path.join(model_dir, "run_id.json")


def read_run_id(model_dir: str) -> str | None:
  """The run id run_id.json records; None if it is missing or holds none."""
  record = files.read_json(run_id_path(model_dir))
  run_id = record.get("run_id") if isinstance(record, dict) else None
  return run_id if isinstance(run_id, str) and run_id else None


def write_run_id(model_dir: str, run_id: str) -> None:
  files.write_json(run_id_path(model_dir), {"run_id": run_id})


def config_history_dir(model_dir: str) -> str:
  return os.path.join(model_dir, "config_history")


def record_config(model_dir: str, config_dict: dict, step: int) -> None:
  """config.json := this run's config; config_history/ keeps every config a run
  started with (a new `<UTC time>_step<N>.json` when it differs from the last one;
  a config.json written before config_history/ existed is kept there first). Called
  once every check that can refuse the run has passed: a refused run writes neither."""
  history = config_history_dir(model_dir)
  try:
    entries = sorted(name for name in os.listdir(history) if name.endswith(".json"))
  except OSError:
    entries = []
  previous = files.read_json(os.path.join(history, entries[-1])) if entries else None
  if not entries:
    earlier = files.read_json(config_path(model_dir))
    if earlier is not None and earlier != config_dict:
      stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(os.path.getmtime(config_path(model_dir))))
      files.write_json(os.path.join(history, f"{stamp}_earlier.json"), earlier)
      previous = earlier
  files.write_json(config_path(model_dir), config_dict)  # first: a full disk leaves nothing else
  if previous != config_dict:
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    files.write_json(os.path.join(history, f"{stamp}_step{step}.json"), config_dict)


def read_summary(model_dir: str) -> dict | None:
  return files.read_json(summary_path(model_dir))


def finished_step(model_dir: str, total_steps: int, config_dict: dict) -> int | None:
  """The final step if a run of this model already finished here, else None.

  Finished means summary.json, the checkpoint and the export of a step >= total
  steps (or of the step finished.json says a run to total steps stopped early at)
  all exist, and config.json names the same model and data; anything
  less goes through the full path (which resumes, or refuses another model).
  """
  summary = read_summary(model_dir)
  if not summary or (summary.get("step", -1) < total_steps
                     and final_step(model_dir, total_steps) != summary.get("step")):
    return None  # short of train.steps, unless it stopped early there (finished.json)
  step = summary["step"]
  previous = files.read_json(config_path(model_dir))
  if not isinstance(previous, dict):
    return None
  if any(previous.get(section) != config_dict[section] for section in ("model", "data")):
    return None
  done = (os.path.isdir(os.path.join(checkpoint_dir(model_dir), str(step))) and
          os.path.isdir(export_dir(model_dir, step)))
  return step if done else None
