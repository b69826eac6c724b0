"""model_dir/checkpoints/<step>/ through orbax's CheckpointManager.

Each step holds three items: `model` and `optimizer` (PyTrees of numpy arrays
keyed by Keras variable path, readable by plain orbax without distloop) and
`meta` (JSON: step and the resolved config). orbax writes a step to a temporary
directory and renames it only when complete, so a crash mid-save leaves the
previous step as the latest.

An async save hands the host copy of the state to one writer thread that runs
orbax's save (orbax's own async save blocked the caller ~20 ms per save, starting a
dozen threads; this blocks ~0.1 ms). Where training leaves cores idle (a GPU job's
host) the write is then free; where training fills them, its ~70 ms of CPU per save
is what a save costs (docs/performance.md).

Only the chief constructs a writing manager (several writers would destroy each
other's temporaries); every process may restore. Restores are shape-checked
against the live model first: orbax silently ignores a wrong target shape, and
this check is also what refuses a model_dir written by another model.

Another run's model weights (checkpoint.init_from, BuildContext.load_weights) are read
through a read-only manager of this module by trainer/state/model_weights.py.
"""
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # orbax imports JAX: keep it off accelerators

import concurrent.futures  # pylint: disable=g-import-not-at-top,wrong-import-position
import contextlib  # pylint: disable=g-import-not-at-top,wrong-import-position
import shutil  # pylint: disable=g-import-not-at-top,wrong-import-position
import time  # pylint: disable=wrong-import-position

import numpy as np  # pylint: disable=wrong-import-position
import orbax.checkpoint as ocp  # pylint: disable=wrong-import-position

from trainer.cluster import sharding  # pylint: disable=wrong-import-position
from trainer.store import files  # pylint: disable=wrong-import-position
from trainer.store import model_dir as layout  # pylint: disable=wrong-import-position
from trainer.store import storage  # pylint: disable=wrong-import-position
from trainer.store import library_noise  # pylint: disable=wrong-import-position
from trainer.errors import StorageError, UserError  # pylint: disable=wrong-import-position

# orbax writes step N to `N.orbax-checkpoint-tmp-<time>` and renames it when complete.
_TEMPORARY = ".orbax-checkpoint-tmp"


class CorruptCheckpoint(Exception):
  """A step on disk that cannot be read (files deleted or truncated)."""


def _item_handlers() -> dict:
  """Declared up front, so a fresh process can read metadata before any save."""
  return {"model": ocp.StandardCheckpointHandler(),
          "optimizer": ocp.StandardCheckpointHandler(),
          "meta": ocp.JsonCheckpointHandler()}


def variables_tree(keyed_variables: dict) -> dict:
  """{'mnist_cnn': {'conv': {'kernel': ndarray, ...}}}: nested by key."""
  tree = {}
  for key, variable in keyed_variables.items():
    *parents, leaf = key.split("/")
    node = tree
    for part in parents:
      node = node.setdefault(part, {})
    # A copy (orbax may write it after training moves on); a sharded variable's whole
    # value, so the checkpoint does not depend on how many servers held it.
    node[leaf] = sharding.to_numpy(variable) if sharding.is_sharded(variable) else np.asarray(
        variable)
  return tree


def assign_tree(keyed_variables: dict, tree: dict) -> None:
  """The arrays of `tree` into the variables of the same keys (a sharded variable's whole
  value is split over its shards by the assignment)."""
  flat = flatten(tree)
  for key, variable in keyed_variables.items():
    variable.assign(flat[key])


def non_finite_keys(tree: dict) -> list[str]:
  """Keys of floating-point arrays holding NaN or Inf (such state is never saved)."""
  return [key for key, value in flatten(tree).items()
          if np.issubdtype(value.dtype, np.floating) and not np.isfinite(value).all()]


def flatten(tree: dict, prefix: str = "") -> dict:
  """{'mnist_cnn/conv/kernel': ndarray, ...}: variables_tree's nesting undone."""
  flat = {}
  for key, value in tree.items():
    path = f"{prefix}/{key}" if prefix else key
    if isinstance(value, dict):
      flat.update(flatten(value, path))
    else:
      flat[path] = value
  return flat


class Checkpoints:
  """Saves and restores training state; `writer=False` never touches the disk.

  `best_metric` makes this a keep-best manager: it keeps the `max_to_keep`
  steps with the best value of that metric (highest or lowest: `best_mode`) (a separate directory from the
  latest-N manager, because orbax's best_fn with max_to_keep can delete the
  newest step).
  """

  def __init__(self, directory: str, *, max_to_keep: int, async_save: bool, writer: bool,
               keep_period: int = 0, best_metric: str | None = None, best_mode: str = "max",
               mismatch_advice: str = "use another --model_dir"):
    self.directory = os.path.abspath(directory)
    # orbax writes its own files (each step renamed into place when whole) in a folder the
    # store hands out, and the store puts a finished step in a bucket model_dir
    files.library_folder(self.directory, "orbax")
    self._in_bucket = files.in_bucket(self.directory)
    self._mismatch_advice = mismatch_advice  # what a refusal of another model's step says to do
    self._writer = writer
    self._best_metric = best_metric
    if writer:
      library_noise.quiet_failed_writes()  # a failed write is one line, not a traceback per write
      options = ocp.CheckpointManagerOptions(
          max_to_keep=max_to_keep,
          keep_period=keep_period or None,
          best_fn=(lambda metrics: metrics[best_metric]) if best_metric else None,
          best_mode=best_mode,
          keep_checkpoints_without_metrics=not best_metric,
          enable_async_checkpointing=False,  # the writer thread is what runs in the background
          create=False)
    else:  # retention and saving options do not apply (orbax warns if they are set)
      options = ocp.CheckpointManagerOptions(
          read_only=True, save_interval_steps=0, max_to_keep=None, create=False,
          cleanup_tmp_directories=False)
    self._manager = ocp.CheckpointManager(self.directory, options=options,
                                          item_handlers=_item_handlers())
    self._writer_thread = concurrent.futures.ThreadPoolExecutor(
        max_workers=1, thread_name_prefix="checkpoint_writer") if writer and async_save else None
    self._in_flight = None  # the writer thread's Future of the save under way
    self._pending = None  # (step, bytes) of the save in flight: what a failure names
    self._failed = False

  def _settled(self) -> ocp.CheckpointManager:
    """orbax's manager once the writer thread is done with it (it is not thread-safe).
    A failure stays for wait() to report."""
    if self._in_flight is not None:
      concurrent.futures.wait([self._in_flight])
    return self._manager

  def latest_step(self) -> int | None:
    return self._settled().latest_step()

  def all_steps(self) -> list[int]:
    return sorted(self._settled().all_steps())

  def reload(self) -> None:
    """Re-reads the committed steps from disk: orbax caches its list, so a reader of
    a live job's checkpoints (continuous_eval) calls this to see new and deleted steps
    (on a bucket, staged anew first)."""
    if not self._writer:
      files.fetch_new_steps(self.directory)
    self._settled().reload()

  def save(self, step: int, model_tree: dict, optimizer_tree: dict, meta: dict,
           metrics: dict | None = None) -> None:
    """Starts saving `step` (with async_save, on the writer thread: wait() for it).

    A step already here is kept as it is: orbax never writes a step twice (it
    raises StepAlreadyExistsError when asked to).
    """
    if not self._writer or step in self.all_steps():
      return
    self.wait()  # a failed earlier save is reported as itself, not as this one
    self._pending = (step, _nbytes(model_tree) + _nbytes(optimizer_tree))
    if self._writer_thread is not None:
      self._in_flight = self._writer_thread.submit(self._write, step, model_tree,
                                                   optimizer_tree, meta, metrics)
    else:
      with self._storage_failures():
        self._write(step, model_tree, optimizer_tree, meta, metrics)

  def _write(self, step: int, model_tree: dict, optimizer_tree: dict, meta: dict,
             metrics: dict | None) -> None:
    """The whole orbax save, committed when it returns (on the writer thread if async)."""
    os.makedirs(self.directory, exist_ok=True)
    # A keep-best manager ranks steps by metric, not by age: after a rollback it must
    # still take a step older than its newest one (orbax skips those unless forced).
    saved = self._manager.save(step, metrics=metrics, force=self._best_metric is not None,
                               args=ocp.args.Composite(
        model=ocp.args.StandardSave(model_tree),
        optimizer=ocp.args.StandardSave(optimizer_tree),
        meta=ocp.args.JsonSave(meta)))
    if saved:  # in a bucket: its files, then its commit marker
      files.step_finished(self.directory, step)
    else:
      files.forget_unfinished_steps(self.directory)

  def restore(self, step: int, model_target: dict, optimizer_target: dict | None,
              *, advice: str | None = None, ours: str = "this config", who: str = ""):
    """Returns (model_tree, optimizer_tree, meta) of `step`; no optimizer_target: model only.

    Raises UserError if the step was written by another model (checked before
    anything is read; `who`: starts its line; `ours`: names this side; `advice`, else
    the manager's, ends it), StorageError if the storage refuses
    the read (permission denied, an I/O error: the disk's fault, not the step's),
    CorruptCheckpoint if its content cannot be read (files deleted or truncated).
    """
    targets = {"model": model_target}
    if optimizer_target is not None:
      targets["optimizer"] = optimizer_target
    with self._read_failures(step):
      metadata = self._settled().item_metadata(step)
      for item, target in targets.items():
        _check_matches(os.path.join(self.directory, str(step), item),
                       getattr(metadata[item], "tree", metadata[item]), target,
                       advice or self._mismatch_advice, ours=ours, who=who)
      restored = self._manager.restore(step, args=ocp.args.Composite(
          meta=ocp.args.JsonRestore(),
          **{item: ocp.args.StandardRestore(target) for item, target in targets.items()}))
      return restored["model"], restored.get("optimizer"), dict(restored["meta"])

  def restore_model_as_stored(self, step: int) -> dict:
    """The model weights of `step` as they were saved, keys and shapes whatever they
    are (a partial warm start picks from them). Raises as restore() does."""
    with self._read_failures(step):
      restored = self._settled().restore(step, args=ocp.args.Composite(
          model=ocp.args.StandardRestore()))
      return flatten(restored["model"])

  @contextlib.contextmanager
  def _read_failures(self, step: int):
    """Permission / I/O errors -> StorageError; anything else unreadable -> CorruptCheckpoint."""
    try:
      if self._in_bucket and not os.path.isdir(os.path.join(self.directory, str(step))):
        files.fetch_new_steps(self.directory)  # saved since it was staged (a worker rolling back)
        self._settled().reload()
      _open_every_file(os.path.join(self.directory, str(step)))
      yield
    except UserError:
      raise
    except Exception as e:  # pylint: disable=broad-except  (orbax/tensorstore raise many types)
      if storage.reason(e) is not None:
        raise storage.read_failure(f"checkpoint {step}", self.directory, e) from None
      raise CorruptCheckpoint(f"{os.path.join(self.directory, str(step))}: "
                              f"{_first_line(e)}") from e

  def set_aside(self, step: int) -> str | None:
    """Moves an unreadable step to <model_dir>/checkpoints_corrupt/ (kept, not deleted),
    so orbax goes on from the previous one. Returns the new place (chief only)."""
    if not self._writer:
      return None
    destination = os.path.join(layout.corrupt_checkpoint_dir(os.path.dirname(self.directory)),
                               f"{step}.{time.strftime('%Y%m%dT%H%M%S')}")
    self._settled()
    files.move(os.path.join(self.directory, str(step)), destination)  # to the bucket too
    self._manager.reload()
    files.forget_unfinished_steps(self.directory)  # no longer a step in a bucket either
    return destination

  def wait(self) -> None:
    """Blocks until pending async saves are on disk (before exit, eval or export).
    A save that failed for lack of space or permission raises StorageError, once."""
    if self._failed:
      return
    in_flight, self._in_flight = self._in_flight, None
    with self._storage_failures():
      if in_flight is not None:
        in_flight.result()  # re-raises what the writer thread raised
    self._pending = None

  @contextlib.contextmanager
  def _storage_failures(self):
    """Disk full / read-only / permission denied -> StorageError naming the step, the
    directory and the space it needed; its unfinished temporary is removed."""
    try:
      yield
    except StorageError:  # a bucket's failure, or a lost lease: one line already
      self._failed = True
      raise
    except Exception as e:  # pylint: disable=broad-except  (tensorstore raises ValueError)
      if storage.reason(e) is None:
        raise
      self._failed = True
      step, needed = self._pending or (None, None)
      _remove_until_settled(self.directory)  # free what the failed save took
      raise storage.failure(f"the checkpoint of step {step}", self.directory, e,
                            needed_bytes=needed) from None

  def close(self) -> None:
    try:
      if self._writer_thread is not None:
        self._writer_thread.shutdown()  # after the save in flight
      self._manager.close()
    except Exception:  # pylint: disable=broad-except
      if not self._failed:  # a failed save was already reported
        raise


def remove_temporaries(directory: str) -> list[str]:
  """Removes the unfinished `<step>.orbax-checkpoint-tmp*` steps a killed save left.

  Only the lock holder calls this (trainer/store/writer_lock.py): another live writer's
  temporaries would be its saves in flight. Returns the names removed.
  """
  try:
    names = [name for name in os.listdir(directory) if _TEMPORARY in name]
  except FileNotFoundError:
    return []
  for name in names:
    shutil.rmtree(os.path.join(directory, name), ignore_errors=True)
  return sorted(names)


def _remove_until_settled(directory: str, quiet_for: float = 0.5, give_up_after: float = 10.0
                          ) -> None:
  """Removes a failed save's temporary once nothing writes into it any more.

  When one item's write fails, orbax raises while tensorstore's threads may still be
  writing the other items' files into the temporary: removed under them, they fail
  again (a traceback from orbax's thread) or leave a new temporary behind (seen under
  load). So: wait until the temporaries stop changing for `quiet_for` s, then remove."""
  deadline = time.monotonic() + give_up_after
  last, quiet_since = None, time.monotonic()
  while time.monotonic() < deadline:
    now = _temporaries_signature(directory)
    if now != last:
      last, quiet_since = now, time.monotonic()
    elif time.monotonic() - quiet_since >= quiet_for:
      break
    time.sleep(0.1)
  remove_temporaries(directory)


def _temporaries_signature(directory: str) -> tuple:
  """(path, size, mtime) of every file under the step temporaries: changes while written."""
  entries = []
  for name in sorted(os.listdir(directory)) if os.path.isdir(directory) else []:
    if _TEMPORARY not in name:
      continue
    for parent, _, names in os.walk(os.path.join(directory, name)):
      for file in names:
        try:
          info = os.stat(os.path.join(parent, file))
        except OSError:
          continue
        entries.append((parent, file, info.st_size, info.st_mtime_ns))
  return tuple(sorted(entries))


def _open_every_file(step_dir: str) -> None:
  """Opens each file of a step once: a permission or I/O error shows here as an OSError
  (orbax takes an unreadable directory for a step with no metadata, i.e. another model's)."""
  def fail(error: OSError):
    raise error
  for parent, _, names in os.walk(step_dir, onerror=fail):
    for name in names:
      with open(os.path.join(parent, name), "rb"):
        pass


def _nbytes(tree: dict) -> int:
  return sum(int(np.asarray(value).nbytes) for value in flatten(tree).values())


def _check_matches(where: str, stored_tree, target: dict,
                   advice: str = "use another --model_dir", *, ours: str = "this config",
                   who: str = "") -> None:
  """UserError unless the stored arrays have the keys and shapes of `target` (`ours`)."""
  who = f"{who}: " if who else ""
  stored = {k: tuple(v.shape) for k, v in flatten(stored_tree or {}).items()}
  wanted = {k: tuple(np.shape(v)) for k, v in flatten(target).items()}
  missing = sorted(set(wanted) - set(stored))
  extra = sorted(set(stored) - set(wanted))
  if missing or extra:
    detail = (f"{ours} has {missing[0]}, the checkpoint does not" if missing
              else f"the checkpoint has {extra[0]}, {ours} does not")
    raise UserError(f"{who}{where} was written by a different model or optimizer ({detail}); "
                    f"{advice}")
  for key in sorted(wanted):
    if stored[key] != wanted[key]:
      raise UserError(f"{who}{where} was written by a different model: {key} has shape "
                      f"{stored[key]} there, {wanted[key]} in {ours}; {advice}")


def _first_line(error: Exception) -> str:
  text = str(error).strip()
  return (text.splitlines()[0] if text else type(error).__name__)[:300]
