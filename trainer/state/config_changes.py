"""What a resumed run may change: the config fields a model_dir fixes.

A model_dir holds one run: one model trained on one data stream. Resuming it (a
model_dir that holds a checkpoint) may change how the run goes on, not what it is:

  may change  train.steps; train.learning_rate and its schedule (lr_schedule,
              warmup_steps, lr_decay_steps, lr_decay_rate: the new schedule applies
              from the resumed step on, and cosine decays to 0 at the new
              train.steps); train.momentum, weight_decay, weight_decay_exclude,
              clip_grad_norm, nonfinite_policy, max_rollbacks,
              action_timeout_seconds; train.global_batch_size
              (the data position is counted in examples: the stream goes on from the
              same example, in batches of the new size); train.steps_per_loop; eval.*; checkpoint.* (retention and
              intervals; init_from only applies to a fresh model_dir); runtime.*
              but seed and mixed_precision (strategy, devices and cluster shape:
              elastic resume)
              data.pad_to (the padded length of a batch, not its examples or order)
  warned      data.dir (the same examples moved to another path, e.g. another mount:
              the order is a function of the seed and the position, so it stays right
              if the files are the same; a warning names both paths)
  fixed       model.*, data.* but dir and pad_to, runtime.seed (the data order, and synthetic data),
              runtime.mixed_precision (float16 keeps a loss scale in the optimizer
              state), train.loss (and loss_weights), train.from_logits, train.optimizer (and optimizer_args, ema_decay), and the fields of any section a
              user's config adds

`check` compares the config with the one the model_dir recorded (config.json, or
the newest checkpoint's meta when config.json is gone) before TensorFlow starts,
and refuses a change to a fixed field in one line naming the field, both values
and what to do (exit 2, nothing written). Pure Python.
"""
import json
import os

from absl import logging

from trainer.state import model_dir as layout
from trainer.errors import UserError

_MUTABLE_SECTIONS = ("train", "eval", "checkpoint", "runtime")
_FIXED_FIELDS = {
    "runtime.seed": "the data order (and synthetic data)",
    "runtime.mixed_precision": "the arithmetic (and the optimizer state, with float16)",
    "train.task": "the training step and its state",
    "train.loss": "the objective",
    "train.loss_weights": "the objective",
    "train.from_logits": "the objective (what the outputs mean to the loss)",
    "train.optimizer": "the optimizer and its state",
    "train.optimizer_args": "the optimizer and its state",
    "train.ema_decay": "the moving average of the weights (part of the optimizer state)",
}
_WARNED_FIELDS = ("data.dir",)
_MUTABLE_FIELDS = ("data.pad_to",)
_MISSING = object()


def is_fixed(field: str) -> bool:
  """Whether a resume must keep `field` ('model.dense_units') as it was."""
  return field in _FIXED_FIELDS or (field not in _MUTABLE_FIELDS
                                    and field.split(".", 1)[0] not in _MUTABLE_SECTIONS)


def check(model_dir: str, config_dict: dict) -> None:
  """UserError if model_dir holds a checkpoint of a run whose fixed fields differ."""
  if not _steps(model_dir):
    return  # nothing to resume: a fresh start (or a start over) in this model_dir
  recorded, where = _recorded(model_dir)
  if recorded is None:
    return
  old, new = _flat(recorded), _flat(config_dict)
  for field in sorted(set(old) | set(new)):
    if not is_fixed(field) or field not in old:  # not recorded: a field added since
      continue
    before, after = old[field], new.get(field, _MISSING)
    if after == before:
      continue
    if field in _WARNED_FIELDS:
      logging.warning("%s=%r, but %s was trained with %s=%r (%s): resuming on the data at the "
                      "new path, taken to be the same examples", field, after, model_dir, field,
                      before, where)
      continue
    what = _FIXED_FIELDS.get(field) or f"the {field.split('.', 1)[0]}"
    now = f"{field}={after!r}" if after is not _MISSING else f"this config has no {field}"
    keep = (f"keep {field}={before!r} (omitting --config resumes with {where})"
            if where == layout.config_path(model_dir) else f"keep {field}={before!r}")
    raise UserError(
        f"{now}, but {model_dir} was trained with {field}={before!r} ({where}): a resume "
        f"cannot change {what}; {keep}, or train in a new --model_dir "
        f"(--config.checkpoint.init_from={model_dir} starts it from these weights)")


def _recorded(model_dir: str) -> tuple[dict | None, str]:
  """The config the model_dir was trained with, and the file it was read from."""
  candidates = [layout.config_path(model_dir)]
  candidates += [os.path.join(layout.checkpoint_dir(model_dir), str(step), "meta", "metadata")
                 for step in reversed(_steps(model_dir))]
  for path in candidates:
    try:
      with open(path) as f:
        value = json.load(f)
    except (OSError, ValueError):
      continue
    if path != candidates[0]:
      value = value.get("config") if isinstance(value, dict) else None
    if isinstance(value, dict):
      return value, path
  return None, ""


def _steps(model_dir: str) -> list[int]:
  try:
    names = os.listdir(layout.checkpoint_dir(model_dir))
  except OSError:
    return []
  return sorted(int(name) for name in names if name.isdigit())


def _flat(tree: dict, prefix: str = "") -> dict:
  flat = {}
  for key, value in tree.items():
    if isinstance(value, dict):
      flat.update(_flat(value, f"{prefix}{key}."))
    else:
      flat[prefix + key] = value
  return flat
