"""The layout of model_dir, and atomic JSON files in it.

  checkpoints/<step>/   orbax (trainer/checkpoints.py)
  checkpoints_best/<step>/   the best by eval accuracy (checkpoint.keep_best)
  checkpoints_corrupt/<step>.<time>/   unreadable steps, set aside
  tensorboard/{train,eval}/
  export/<step>/        SavedModel (trainer/export.py)
  config.json           the resolved config of the last run started here
  summary.json          written when a run finishes
"""
import json
import os

from trainer import storage


def checkpoint_dir(model_dir: str) -> str:
  return os.path.join(model_dir, "checkpoints")


def best_checkpoint_dir(model_dir: str) -> str:
  return os.path.join(model_dir, "checkpoints_best")


def summary_path(model_dir: str) -> str:
  return os.path.join(model_dir, "summary.json")


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


def write_json(path: str, value: dict) -> None:
  """Write-then-rename: readers never see half a file. A full disk or a denied
  write raises StorageError (one line) and leaves the previous file as it was."""
  temporary = path + ".tmp"
  text = json.dumps(value, indent=2, sort_keys=True) + "\n"
  try:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(temporary, "w") as f:
      f.write(text)
    os.replace(temporary, path)
  except OSError as e:
    if storage.reason(e) is None:
      raise
    try:
      os.remove(temporary)
    except OSError:
      pass
    raise storage.failure(os.path.basename(path), path, e, needed_bytes=len(text)) from None


def read_summary(model_dir: str) -> dict | None:
  try:
    with open(summary_path(model_dir)) as f:
      return json.load(f)
  except (OSError, ValueError):
    return None


def finished_step(model_dir: str, total_steps: int, config_dict: dict) -> int | None:
  """The final step if a run of this model already finished here, else None.

  Finished means summary.json, the checkpoint and the export of a step >= total
  steps all exist, and config.json names the same model and data; anything
  less goes through the full path (which resumes, or refuses another model).
  """
  summary = read_summary(model_dir)
  if not summary or summary.get("step", -1) < total_steps:
    return None
  step = summary["step"]
  try:
    with open(config_path(model_dir)) as f:
      previous = json.load(f)
  except (OSError, ValueError):
    return None
  if any(previous.get(section) != config_dict[section] for section in ("model", "data")):
    return None
  done = (os.path.isdir(os.path.join(checkpoint_dir(model_dir), str(step))) and
          os.path.isdir(os.path.join(model_dir, "export", str(step))))
  return step if done else None
