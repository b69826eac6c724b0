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
              same example, in batches of the new size; not with length bucketing,
              data.pad_to and data.bucket_window, which groups examples into batches
              of that size: refused); train.steps_per_loop; eval.*; predict.*; checkpoint.* (retention and
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
              user's config adds - unless the Task declares which of its own
              section's fields fix the run (`Task.run_fixing_fields`,
              trainer/setup/run_fields.py): that section's other fields may change,
              each change logged (`may_change` below)

The checkpoint is the record, config.json only a copy: each step's meta holds
the run's identity (`identity`: the fixed fields, the Task's class, the key set
and shapes of what is saved). `check` compares the config with the newest step's
meta (config.json only when no step's meta can be read) before TensorFlow starts,
and refuses a change to a fixed field in one line naming the field, both values
and what to do (exit 2, nothing written) - an edited or emptied config.json
included: it is refused, not trusted. `check_step` compares the step being
restored (a resume, eval, export, continuous_eval) with this run: a step of
another run copied into checkpoints/ is refused the same way, and never taken for
a corrupt one (nothing is moved). A step written before meta held an identity is
judged by its meta's config.

Which run: fields alone cannot tell two runs apart that differ only in what a resume
may change (train.learning_rate), so each run has an id (a uuid4), created by the
chief when a run first starts in a model_dir (a warm start from checkpoint.init_from
too: a new run, never the source's id) and kept in model_dir/run_id.json, and each
step's meta names its run (identity["run_id"]). `check_run` refuses the step being
restored (a resume, eval, export, continuous_eval: TrainState, after `check_step`,
so a step whose fields or Task differ is named by them) if it is another run's, in
one line, nothing moved; `check` reads the fixed fields of this run's newest step,
never another run's (whose values it would tell the user to keep). The id
lives in its own file, not config.json (a copy, edited, deleted, loaded as a config)
nor the earliest step (retention deletes it, and a step copied in can be earlier):
without run_id.json, the model_dir's run is the one its steps name (`model_dir_run`),
and steps naming more than one (or some none) are refused until one is moved out.
Steps and model_dirs written before run ids (none recorded) are taken as this
model_dir's run. Pure Python.
"""
import hashlib
import json
import os
import uuid

from absl import logging

from trainer.store import model_dir as layout
from trainer.errors import UserError
from trainer.store import files

_MUTABLE_SECTIONS = ("train", "eval", "predict", "checkpoint", "runtime")
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
# What only the eval split depends on: --mode=eval/export may read another one (a resume
# may not: these fields choose which rows are held out from training).
_EVAL_SPLIT_FIELDS = ("data.num_eval_examples",)
_MUTABLE_FIELDS = ("data.pad_to",)
_MISSING = object()
_NO_COPY = object()


def is_fixed(field: str) -> bool:
  """Whether a resume must keep `field` ('model.dense_units') as it was."""
  return field in _FIXED_FIELDS or (field not in _MUTABLE_FIELDS
                                    and field.split(".", 1)[0] not in _MUTABLE_SECTIONS)


def check(model_dir: str, config_dict: dict, may_change=None) -> None:
  """UserError if model_dir holds a checkpoint of a run whose fixed fields differ.
  `may_change(field)`: True for a field the Task lets change on resume (logged)."""
  if not layout.checkpoint_steps(model_dir):
    return  # nothing to resume: a fresh start (or a start over) in this model_dir
  recorded, where = _recorded(model_dir)
  if recorded is None:
    return
  copy = files.read_json(layout.config_path(model_dir))
  new = _plain(_flat(config_dict))  # as the record holds it (JSON: a tuple is a list)
  for field, before in sorted(recorded.items()):
    after = new.get(field, _MISSING)
    if after == before:
      continue
    if may_change is not None and may_change(field):
      logging.info("%s=%r on resume (it was %r, %s): the Task lets it change", field, after,
                   before, where)
      continue
    if field in _WARNED_FIELDS:
      logging.warning("%s=%r, but %s was trained with %s=%r (%s): resuming on the data at the "
                      "new path, taken to be the same examples", field, after, model_dir, field,
                      before, where)
      continue
    what = _FIXED_FIELDS.get(field) or f"the {field.split('.', 1)[0]}"
    now = f"{field}={after!r}" if after is not _MISSING else f"this config has no {field}"
    copied = _flat(copy).get(field, _MISSING) if isinstance(copy, dict) else _NO_COPY
    if copied is _NO_COPY:
      keep = f"keep {field}={before!r}"
    elif copied == before:
      keep = f"keep {field}={before!r} (omitting --config resumes with config.json)"
    else:  # config.json was edited or replaced: the checkpoint decides, config.json is a copy
      says = f"{field}={copied!r}" if copied is not _MISSING else f"no {field}"
      keep = (f"keep {field}={before!r} ({layout.config_path(model_dir)} says {says}: it is "
              f"only a copy, config_history/ holds the ones written)")
    raise UserError(
        f"{now}, but {model_dir} was trained with {field}={before!r} ({where}): a resume "
        f"cannot change {what}; {keep}, or train in a new --model_dir "
        f"(--config.checkpoint.init_from={model_dir} starts it from these weights)")
  _check_bucketing(model_dir, recorded, where, new)


def _check_bucketing(model_dir: str, recorded: dict, where: str, new: dict) -> None:
  """Length bucketing (data.bucket_window, input_pipelines/buckets.py) groups windows of
  bucket_window * train.global_batch_size examples: another batch size, or a run from
  before bucketing (no data.bucket_window recorded), would regroup a window half used,
  repeating some examples and skipping others. UserError naming the field."""
  if not new.get("data.pad_to") or not new.get("data.bucket_window"):
    return
  if "data.bucket_window" not in recorded:
    raise UserError(f"{model_dir} was trained without length bucketing ({where} records no "
                    f"data.bucket_window): resuming with data.bucket_window="
                    f"{new['data.bucket_window']} would change its data order; set "
                    f"--config.data.bucket_window=0 to resume it")
  before = _recorded_batch_size(model_dir)
  after = new.get("train.global_batch_size")
  if before is not None and before != after:
    raise UserError(f"train.global_batch_size={after!r}, but {model_dir} was trained with "
                    f"train.global_batch_size={before!r} and data.bucket_window="
                    f"{new['data.bucket_window']} (length bucketing groups examples into "
                    f"batches of that size): keep train.global_batch_size={before!r}, or "
                    f"train in a new --model_dir")


def _recorded_batch_size(model_dir: str):
  """train.global_batch_size of the newest step whose meta holds its config; None if none."""
  for _, meta in layout.steps_with_meta(model_dir):
    if meta is not None and isinstance(meta.get("config"), dict):
      return _flat(meta["config"]).get("train.global_batch_size")
  return None


def identity(config_dict: dict, task_name: str, keyed_shapes: dict,
             run_id: str | None = None) -> dict:
  """What a checkpoint step records of its run (meta["identity"]): the fixed fields
  (flat), the Task's class ('module:Class'), its structure (`structure`) and the run's
  id (`run_id`: which run of that config it is)."""
  recorded = {"fixed": fixed_fields(config_dict), "task": task_name,
              "structure": structure(keyed_shapes)}
  if run_id:
    recorded["run_id"] = run_id
  return recorded


def new_run_id() -> str:
  return uuid.uuid4().hex


def step_run(meta: dict) -> str | None:
  """The run id a step's meta names; None for a step written before run ids."""
  recorded = meta.get("identity") if isinstance(meta, dict) else None
  run_id = recorded.get("run_id") if isinstance(recorded, dict) else None
  return run_id if isinstance(run_id, str) and run_id else None


def model_dir_run(model_dir: str) -> tuple[str | None, str]:
  """(the run id of model_dir, where it was read): run_id.json's; without it, the one
  every step's meta names (run_id.json lost, or a model_dir copied without it); None
  if nothing names one (a fresh model_dir, or one written before run ids). UserError
  if the steps name more than one run (or some name none): without run_id.json,
  nothing says which of them is this model_dir's."""
  recorded = layout.read_run_id(model_dir)
  if recorded:
    return recorded, layout.run_id_path(model_dir)
  runs = {}  # step -> its run id (None: written before run ids)
  for step, meta in layout.steps_with_meta(model_dir):
    if meta is not None:
      runs[step] = step_run(meta)
  named = set(runs.values())
  if named <= {None}:
    return None, ""
  if len(named) == 1:
    return named.pop(), f"named by each of its steps ({layout.run_id_path(model_dir)} is missing)"
  steps = ", ".join(f"step {step}: {run or 'no run id'}" for step, run in sorted(runs.items()))
  raise UserError(f"{layout.checkpoint_dir(model_dir)} holds steps of more than one run "
                  f"({steps}) and {layout.run_id_path(model_dir)}, which names this "
                  f"model_dir's run, is missing: move the steps of the other run out of "
                  f"checkpoints/ (or write {{\"run_id\": \"<this run's id>\"}} there); nothing "
                  f"was moved or deleted")


def check_run(meta: dict, where: str, run: str | None, source: str) -> None:
  """UserError (nothing moved) if the step at `where` (its `meta`) names a run other
  than `run`, the model_dir's (read from `source`). A step or a model_dir without a
  run id (written before run ids) is taken as this run."""
  theirs = step_run(meta)
  if theirs is None or run is None or theirs == run:
    return
  raise UserError(f"{where} belongs to another run (run {theirs}; this model_dir's run is "
                  f"{run}, {source}): a model_dir resumes, evaluates and exports its "
                  f"own run's steps only; move that step out of {os.path.dirname(where)}, or "
                  f"to start from another run's weights use --config.checkpoint.init_from="
                  f"{where} in a new --model_dir (nothing was moved or deleted)")


def fixed_fields(config_dict: dict) -> dict:
  return {field: value for field, value in _flat(config_dict).items() if is_fixed(field)}


def structure(keyed_shapes: dict) -> dict:
  """{'variables': N, 'digest': ...} of every saved key and its shape (`keyed_shapes`:
  'model/<key>' -> shape): another model or optimizer saves another set."""
  lines = sorted(f"{key}:{list(shape)}" for key, shape in keyed_shapes.items())
  return {"variables": len(lines),
          "digest": hashlib.sha256("\n".join(lines).encode()).hexdigest()[:16]}


def check_step(meta: dict, where: str, config_dict: dict, task_name: str,
               keyed_shapes: dict, *, training: bool, may_change=None) -> None:
  """UserError (nothing moved: a step of another run is no corrupt step) unless the
  checkpoint step whose meta is `meta` (at `where`) belongs to this run: the same
  fixed fields (data.dir may move; eval and export may read another eval split), the
  same Task and the same structure. A meta
  without an identity (written before it had one) is judged by its config."""
  recorded = meta.get("identity") if isinstance(meta.get("identity"), dict) else {}
  fixed = recorded.get("fixed")
  if not isinstance(fixed, dict):
    fixed = fixed_fields(meta.get("config") or {})
  new = _plain(_flat(config_dict))  # as the record holds it (JSON: a tuple is a list)
  advice = ("a resume cannot change it: keep the run's value, or train in a new --model_dir"
            if training else "pass the training run's value, or evaluate the right --model_dir")
  for field, before in sorted(fixed.items()):
    after = new.get(field, _MISSING)
    if (after == before or field in _WARNED_FIELDS or not is_fixed(field)
        or (may_change is not None and may_change(field))
        or (not training and field in _EVAL_SPLIT_FIELDS)):
      continue
    now = f"{field}={after!r}" if after is not _MISSING else f"no {field}"
    _refuse(where, f"{field}={before!r}", f"{now} in this config", advice)
  task = recorded.get("task")
  if task and not _same_task(task, task_name):
    _refuse(where, f"the Task {task}", f"the Task {task_name} in this run",
            "train.task (or trainer.run's task) names the Task that trained it")
  shape = recorded.get("structure")
  if isinstance(shape, dict) and shape != structure(keyed_shapes):
    _refuse(where, f"{shape.get('variables')} saved variables ({shape.get('digest')})",
            f"{len(keyed_shapes)} ({structure(keyed_shapes)['digest']}) in this run",
            "another model or optimizer")


def _refuse(where: str, theirs: str, ours: str, advice: str) -> None:
  raise UserError(f"{where} was trained with {theirs}, not {ours}: a step of another run, "
                  f"or a config that is not this run's; {advice} (nothing was moved or "
                  f"deleted)")


def _same_task(recorded: str, current: str) -> bool:
  """'module:Class' names; a module run as a script (__main__) or loaded from a path
  (_distloop_plugin_<stem>) may be named otherwise by another run: the class decides."""
  def parts(name):
    module, _, qualname = name.rpartition(":")
    return module.removeprefix("_distloop_plugin_"), qualname
  (module_a, class_a), (module_b, class_b) = parts(recorded), parts(current)
  return class_a == class_b and (module_a == module_b or "__main__" in (module_a, module_b))


def _recorded(model_dir: str) -> tuple[dict | None, str]:
  """The fixed fields (flat) the model_dir was trained with, and the file they were read
  from: the newest step's meta that can be read, of this model_dir's run (a step of
  another run is not its record: the restore refuses it); config.json when none can."""
  run, _ = model_dir_run(model_dir)
  for step, meta in layout.steps_with_meta(model_dir):
    path = os.path.join(layout.checkpoint_dir(model_dir), str(step), "meta", "metadata")
    if meta is not None and step_run(meta) in (None, run):
      recorded = meta.get("identity") if isinstance(meta.get("identity"), dict) else {}
      if isinstance(recorded.get("fixed"), dict):
        return recorded["fixed"], path
      if isinstance(meta.get("config"), dict):
        return fixed_fields(meta["config"]), path
  copy = files.read_json(layout.config_path(model_dir))
  if isinstance(copy, dict):
    return fixed_fields(copy), layout.config_path(model_dir)
  return None, ""


def _plain(value):
  return json.loads(json.dumps(value, default=str))


def _flat(tree: dict, prefix: str = "") -> dict:
  flat = {}
  for key, value in tree.items():
    if isinstance(value, dict):
      flat.update(_flat(value, f"{prefix}{key}."))
    else:
      flat[prefix + key] = value
  return flat
