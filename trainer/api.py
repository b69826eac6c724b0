"""The Python API: `trainer.run(config, model_dir, mode=...)`, the CLI without the process.

    import trainer, configs
    summary = trainer.run(configs.get("synthetic"), "/tmp/run")     # trains; again: resumes
    result = trainer.run("synthetic", "/tmp/run", mode="eval")

For a notebook, a script, or a worker process of a distributed engine (Ray
Train calls a Python function per worker). Everything the CLI checks is checked
(the config, the model_dir, the data, a resume's changes), in the same order and
with the CLI's one-line messages (in its own words: in_api_words), raised, never `sys.exit`:

    UserError, input_pipelines.DataError  bad input (the CLI's exit 2)
    NonFiniteError, StorageError           the run failed (exit 1)
    UserCodeError                          a Task or Action failed at run time (exit 1)
    Preempted (a BaseException)            stopped at a step on disk (exit 42)

No signal handler is installed unless `handle_signals=True` (the CLI passes
it): then SIGTERM/SIGINT/SIGHUP stop the run at the next loop boundary with the
step on disk, as on the command line. Logs go to stderr at INFO level.
"""
import contextlib
import os
import re
import sys

from absl import logging

import input_pipelines
from input_pipelines.native_output import native_startup_silenced
from trainer.store import library_noise
from trainer.cluster import first_import
from trainer.cluster import kubernetes
from trainer.cluster import preemption
from trainer.loop import continuous_eval
from trainer.state import config_changes
from trainer.state import elastic
from trainer.store import files
from trainer.store import mirror
from trainer.store import model_dir as layout
from trainer.store import writer_lock
from trainer.setup import epochs
from trainer.setup import module_names
from trainer.setup import plugins
from trainer.setup import validation
from trainer.errors import Preempted, StorageError, UserCodeError, UserError, in_api_words

MODES = ("train", "eval", "train_and_eval", "continuous_eval", "export", "predict")


def run(config, model_dir: str, *, mode: str = "train", task=None, actions=(),
        checkpoint_step: int | None = None, handle_signals: bool = False):
  """Runs `mode` in `model_dir` and returns its result: the summary (train, train_and_eval;
  a finished run's summary.json with "already_finished": True), {"step", each eval value,
  "examples"} (eval), the SavedModel's directory (export), the steps evaluated
  (continuous_eval), the predictions' summary (predict: docs/predict.md).

  `config`: a ConfigDict, a built-in config's name or a config file's path. `task`: a
  trainer.Task (or a Task class, or a function of the config returning one) instead of
  train.task. `actions`: trainer.Action objects, run besides the config's. Re-running on
  the same model_dir resumes (in the same process too)."""
  if mode not in MODES:
    raise UserError(f"mode={mode!r} is not one of {', '.join(MODES)}")
  config = load_config(config)
  preemption.clear()  # a stop asked of an earlier run in this process is not this run's
  if logging.get_verbosity() < logging.INFO:  # visible by default; a caller's choice stays
    logging.set_verbosity(logging.INFO)
  if logging.get_verbosity() < logging.DEBUG:  # the CLI's policy: libraries' INFO hidden
    library_noise.hide_library_info()
  with _signals_handled() if handle_signals else contextlib.nullcontext():
    try:
      model_dir = mirror.staged(model_dir)  # gs://, s3://: a local copy, written back
      result = execute(config, model_dir, mode, checkpoint_step, task=task, actions=actions)
      return mirror.display(result) if isinstance(result, str) else result
    except (UserError, input_pipelines.DataError, Preempted) as e:
      _for_the_caller(e)
      raise
    except Exception as e:  # pylint: disable=broad-except  (translated or re-raised)
      translated = translate(e)
      if translated is None:
        _for_the_caller(e)
        raise
      raise _for_the_caller(translated) from None
    finally:  # the CLI leaves without them (os._exit); a Python caller's process goes on
      batches = sys.modules.get("trainer.loop.batches")
      if batches is not None:
        batches.join_teardowns()


def predict(config, model_dir: str, *, task=None, checkpoint_step: int | None = None,
            handle_signals: bool = False) -> dict:
  """`run(..., mode="predict")`: predict.split scored once into predict.output
  (default model_dir/predictions/<step>/); the summary (rows, rows/s, output, digest)."""
  return run(config, model_dir, mode="predict", task=task, checkpoint_step=checkpoint_step,
             handle_signals=handle_signals)


def _for_the_caller(error: BaseException) -> BaseException:
  """`error` as run()'s caller reads it: a bucket by its URL; a refusal in the API's words."""
  if error.args and isinstance(error.args[0], str):
    words = in_api_words if isinstance(error, (UserError, input_pipelines.DataError)) else str
    error.args = (words(mirror.display(error.args[0])), *error.args[1:])
  return error


def execute(config, model_dir: str, mode: str, checkpoint_step: int | None = None, *,
            task=None, actions=(), config_source: str = "the config given"):
  """The run, checks first: bad input costs a second and leaves model_dir untouched.

  Flags aside (the CLI's), the order is: a resume on another shape that the JSON on disk
  refuses (elastic.refuse_before_start), the config's fields and plug-ins, the model_dir's
  shape, a resume's changes (before TensorFlow starts), the data, the runtime and strategy,
  the batch sizes against the splits and the memory available, then (training) the writer
  lock on model_dir, then the Trainer. `config_source` says in words where the config came
  from (the logs of eval modes)."""
  model_dir = mirror.staged(model_dir, fresh=False)  # gs://, s3://: its local staging
  if mode in ("train", "train_and_eval"):  # before a plug-in's import starts TensorFlow
    elastic.refuse_before_start(model_dir, config)
  with native_startup_silenced():  # a plug-in module may import TensorFlow
    check_config(config)
  layout.check_layout(model_dir)
  if is_evaluator_task():
    mode = task_mode(mode)
    config = _local(config)
    logging.info("This task is the evaluator of its cluster (TF_CONFIG): --mode=%s of %s on "
                 "one process (runtime.strategy=%s), apart from the training tasks", mode,
                 model_dir, config.runtime.strategy)
  if checkpoint_step is not None and mode not in ("eval", "predict"):
    raise UserError(f"--checkpoint_step applies to --mode=eval and --mode=predict only, "
                    f"not --mode={mode}")
  validation.check_mode(config, mode)  # what needs evals during training
  if is_parameter_server_task(config):
    raise UserError("this process is a worker or ps task of a parameter-server cluster "
                    "(TF_CONFIG): it serves; run `python -m trainer` there")
  _stop_if_signalled(config)
  training = mode in ("train", "train_and_eval")
  if training or mode == "continuous_eval":  # a broken finished.json: refused, not guessed
    layout.finished_record(model_dir)
  if training:
    task, may_change = task_fields(config, task)
    # A changed seed is no "already finished".
    config_changes.check(model_dir, config.to_dict(), may_change)
    if _already_finished(model_dir, config):
      return {**layout.read_summary(model_dir), "already_finished": True}
  # Data before the runtime: bad files fail before TensorFlow starts. (Keras's
  # download path does import TensorFlow, hence the silenced start-up lines.)
  with native_startup_silenced():
    splits = plugins.load_data(config.data, config.runtime.seed)
  epoch_plan = epochs.plan(config, splits[0])
  if epoch_plan:  # from here on, a run of the steps they make from the newest data position
    config = epochs.resolved(config, epoch_plan, layout.newest_data_position(model_dir))
    if training and _already_finished(model_dir, config):
      return {**layout.read_summary(model_dir), "already_finished": True}
  epochs.say_replaced()  # the command line's length, past the refusals of config and data
  with native_startup_silenced(), first_import.collector_paused():  # TF's, orbax's lines
    from trainer.cluster import runtime  # pylint: disable=g-import-not-at-top
    from trainer.loop import controller  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import
  strategy, chief = runtime.start(config, splits, training=training)
  _stop_if_signalled(config)

  with (_writer(model_dir, config) if training and chief else contextlib.nullcontext()):
    return _run_mode(config, model_dir, mode, checkpoint_step, strategy, splits, task, actions,
                     config_source, epoch_plan)


def _already_finished(model_dir: str, config) -> bool:
  """A finished run of this config is there (train.epochs: known once the data is)."""
  return not config.train.epochs and layout.finished_step(
      model_dir, config.train.steps, config.to_dict()) is not None


def _run_mode(config, model_dir: str, mode: str, checkpoint_step: int | None, strategy,
              splits, task, actions, config_source: str, epoch_plan=None):
  from trainer.loop import controller  # pylint: disable=g-import-not-at-top
  from trainer.cluster import peers  # pylint: disable=g-import-not-at-top
  training = mode in ("train", "train_and_eval")
  try:
    trainer = controller.Trainer(config, model_dir, strategy, splits, task=task,
                                 actions=actions, read_only=not training, epoch_plan=epoch_plan)
  except Exception as e:  # pylint: disable=broad-except
    lost = peers.lost(strategy, e, step=None)
    if lost is None:
      raise
    raise lost from e  # a peer is gone: one line, not this worker's traceback
  preemption.end_start_up()  # built: from the restore on, stop at safe (agreed) points
  try:
    refuse_what_the_task_lacks(trainer, mode)
    if training:
      return trainer.train(eval_interval=config.eval.interval if mode == "train_and_eval" else 0)
    # Which config a mode used: logged once past the refusals that are one line alone.
    if mode == "continuous_eval":
      logging.info("continuous_eval with %s", config_source)
      return continuous_eval.ContinuousEval(
          trainer, final_step=config.train.steps, poll_seconds=config.eval.poll_seconds,
          timeout_seconds=config.eval.timeout_seconds, sleep=preemption.sleep,
          stopped=preemption.requested,
          finished=lambda: layout.final_step(model_dir, config.train.steps)).run()
    position = (trainer.train_state.restore_latest() if checkpoint_step is None
                else _restore_step(trainer, checkpoint_step))
    if position is None:
      raise UserError(f"no checkpoint in {layout.checkpoint_dir(model_dir)}; train first")
    if preemption.requested():  # eval and export are single-process: decide locally
      raise Preempted(position.step)
    logging.info("%s of step %d with %s", mode, position.step, config_source)
    if mode == "eval":
      return {"step": position.step, **trainer.evaluate(position.step)}
    if mode == "predict":  # pyarrow and the output folder: only a predict run loads them
      from trainer.loop import predict  # pylint: disable=g-import-not-at-top
      return predict.predict(trainer, position.step)
    return trainer.export(position.step)
  except UserCodeError as e:  # the user's Task or Action failed at run time
    trainer.train_state.wait()  # the pending saves on disk: the line says which is intact
    raise e.after_saves(trainer.train_state.latest_step()) from None
  except Exception as e:  # pylint: disable=broad-except
    lost = peers.lost(strategy, e, trainer.failure_step())
    if lost is None:
      raise
    raise lost from e  # a peer is gone: one line, not this worker's traceback
  finally:  # an error on its way out (sys.exc_info) is the one to report, not the close's
    trainer.close(failing=sys.exc_info()[1] is not None)


def refuse_what_the_task_lacks(trainer, mode: str) -> None:
  """UserError, before any checkpoint is read or anything written, for a mode whose work
  the Task does not have (both are optional, docs/tasks.md): no eval_step, or one that
  reports no value, leaves eval, continuous_eval and train_and_eval nothing to evaluate
  (it would print 0 examples and exit 0); an export() missing or returning None leaves
  export nothing to write (it printed "None"). --mode=train trains such a Task: its
  summary then claims no eval and no export."""
  from trainer.task.contract import Task  # pylint: disable=g-import-not-at-top
  task = trainer.task
  name = type(task).__name__
  if mode in ("eval", "continuous_eval", "train_and_eval") and not trainer.evaluates:
    lacks = (f"{name} has no eval_step" if type(task).eval_step is Task.eval_step
             else f"{name}.eval_step returns no value")
    instead = "; --mode=train trains without evals" if mode == "train_and_eval" else ""
    raise UserError(f"{lacks}: --mode={mode} has nothing to evaluate{instead}")
  if mode == "predict":
    from trainer.loop import predict  # pylint: disable=g-import-not-at-top
    predict.refuse_what_cannot_be_predicted(trainer)
  if mode == "export" and trainer.serving.served() is None:  # UserError if it cannot serve
    lacks = (f"{name} has no export()" if type(task).export is Task.export
             else f"{name}.export() returns None")
    raise UserError(f"{lacks}: --mode=export has nothing to write (export() returns a "
                    f"trainer.Export, docs/tasks.md)")


def load_config(config):
  """A ConfigDict as given; a name or a path loaded as --config would load it."""
  if isinstance(config, str):
    from configs import files as config_files  # pylint: disable=g-import-not-at-top
    try:
      spec = config_files.resolve(config)
      module_names.put_config_folder_on_path(spec)
      return config_files.load(spec)
    except (config_files.ConfigFileError, ValueError) as e:
      raise UserError(str(e)) from None
  return config


@contextlib.contextmanager
def _signals_handled():
  """The handlers for the block; none off the main thread (Python allows them only there:
  a thread of an engine such as Ray Train, whose own machinery then decides a stop)."""
  installed = preemption.install()
  if not installed:
    logging.info("handle_signals=True: no signal handler installed (not the main thread; "
                 "signals are the host's to handle)")
  try:
    yield
  finally:
    if installed:
      preemption.uninstall()


@contextlib.contextmanager
def _writer(model_dir: str, config):
  """Holds the model_dir lock for the block (the chief of train/train_and_eval only).

  Taken after every check that needs no model (so a refused run never creates
  model_dir); a refusal inside the block (another model's checkpoint, bad data found
  by the model's checks or in training), or a signal before training (a hung model
  builder: trainer/cluster/preemption.py), removes the lock file, and model_dir if taking the
  lock created it and it holds no results. With the lock held, unfinished orbax
  temporaries cannot be another live writer's: they are removed. A directory that
  cannot be written fails here (exit 1), not at the first save after training.
  """
  from trainer.state import checkpoints  # pylint: disable=g-import-not-at-top  (imports orbax)
  lock = writer_lock.WriterLock.acquire(model_dir,
                                        lease_seconds=config.checkpoint.lease_seconds)
  refused = failing = False
  try:
    with preemption.undone_on_forced_exit(lambda: lock.release(refused=True)):
      layout.check_writable(model_dir)
      for directory in (layout.checkpoint_dir(model_dir),
                        layout.best_checkpoint_dir(model_dir)):
        removed = checkpoints.remove_temporaries(directory)
        if removed:
          logging.info("Removed %d unfinished checkpoint(s) a killed save left in %s: %s",
                       len(removed), directory, ", ".join(removed))
        files.forget_unfinished_steps(directory)  # a bucket's, without a commit marker
      yield lock
  except Exception as e:  # pylint: disable=broad-except  (re-raised)
    failing = True
    refused = is_bad_input(e) and not layout.holds_results(model_dir)
    raise
  except Preempted as e:  # stopped before training: leave model_dir as a refusal does
    failing = True
    refused = e.step is None and not layout.holds_results(model_dir)
    raise
  finally:
    try:
      lock.release(refused=refused)
    except StorageError as e:  # a bucket still down: the error the run ends with is the one
      if not failing:
        raise
      logging.warning("%s", e)


def is_bad_input(error: BaseException) -> bool:
  """Whether the CLI reports `error` as bad input (exit 2)."""
  return (isinstance(error, (UserError, input_pipelines.DataError))
          or isinstance(translate(error), (UserError, input_pipelines.DataError)))


def _stop_if_signalled(config) -> None:
  """Start-up of a single process: a signal so far ends the run now, exit 42 (nothing
  trained, nothing to save). Multi-worker jobs wait for the first agreed check, right
  after the restore (a worker leaving alone would hang the others in a collective)."""
  if preemption.requested() and config.runtime.strategy != "multi_worker_mirrored":
    raise Preempted(None)


def _restore_step(trainer, step: int):
  """--checkpoint_step=N: the position of step N once loaded; UserError naming the steps
  there are if N is not one of them."""
  available = trainer.checkpoints.all_steps()
  if step not in available:
    raise UserError(f"--checkpoint_step={step}: no such checkpoint in "
                    f"{trainer.checkpoints.directory} (available steps: "
                    f"{', '.join(map(str, available)) or 'none'})")
  position = trainer.train_state.restore(step)
  if position is None:
    raise UserError(f"--checkpoint_step={step}: "
                    f"{os.path.join(trainer.checkpoints.directory, str(step))} cannot be read")
  return position


_XLA_NOT_DETERMINISTIC = "do not yet have a deterministic XLA implementation"


class DataErrorInTfData(input_pipelines.DataError):
  """A source's DataError raised inside tf.data: its threads may still be reading."""


def translate(error: BaseException) -> Exception | None:
  """TensorFlow's wrapping of what is really bad input, as the one-line error: a
  DataError raised by a source inside tf.data; XLA without deterministic kernels; a step's
  per-example value of another length than its batch."""
  text = str(error)
  if _XLA_NOT_DETERMINISTIC in text:
    op = next((line.strip() for line in text.splitlines() if _XLA_NOT_DETERMINISTIC in line),
              "")[:200]
    return UserError("runtime.jit_compile=true cannot be runtime.deterministic=true for this "
                     f"model: XLA has no deterministic kernel for one of its ops ({op}); set "
                     "one of them to false")
  match = re.search(r"assertion failed: \[(\w+ returned .+? of length \d+ on a batch of \d+ "
                    r"examples: .+? \(a scalar\))\]", text)
  if match:  # a per-example value's length, checked as the step ran (trainer/loop/step_values.py)
    return UserError(match.group(1).replace("\\'", "'"))
  match = re.search(r"DataError: (.+)", text)
  if match and not isinstance(error, input_pipelines.DataError):
    return DataErrorInTfData(match.group(1).strip())
  return None


def check_config(config) -> None:
  """UserError naming the first bad field of `config`, before anything runs or is
  written: the fields' own checks (trainer/setup/validation.py, no TensorFlow; it imports
  the plug-ins the config names), then checkpoint.init_from where it is read."""
  validation.check_config(config)
  layout.check_init_from(config.checkpoint)


def task_fields(config, task):
  """(the run's Task, made now if it is given, or `task` as it is; the predicate of the
  fields of its own config sections that may change on resume, or None): a Task's
  `run_fixing_fields` is read before a resume's changes are checked."""
  if task is None and not config.train.task:
    return task, None  # the built-in step: distloop's own rules
  from trainer.loop import assembly  # pylint: disable=g-import-not-at-top
  from trainer.setup import run_fields  # pylint: disable=g-import-not-at-top
  task = assembly.create_task(config, task)
  return task, run_fields.may_change(task, config.to_dict())


def is_parameter_server_task(config) -> bool:
  """A worker or ps task of a parameter-server cluster (TF_CONFIG): it serves, the
  chief trains. Read without TensorFlow, before the finished-job check."""
  if config.runtime.strategy != "parameter_server":
    return False
  return _tf_config_task().get("type") in ("worker", "ps")


def is_evaluator_task() -> bool:
  """TF_CONFIG names this process the cluster's `evaluator` (TF's convention: a task
  outside the training cluster that evaluates its checkpoints). Read without TensorFlow."""
  return _tf_config_task().get("type") == "evaluator"


def task_mode(mode: str) -> str:
  """The mode this process runs. Every task of a cluster is usually given the same command
  (--mode=train): the evaluator task runs continuous_eval instead, whatever the mode,
  except --mode=eval, which it runs as asked (both only read model_dir). It never
  exports: only the chief writes into model_dir."""
  if not is_evaluator_task():
    return mode
  if mode in ("export", "predict"):
    raise UserError(f"--mode={mode}: this process is the evaluator task of its cluster "
                    f"(TF_CONFIG task type 'evaluator'), which only reads model_dir; "
                    f"{mode} without TF_CONFIG (or on the chief)")
  return mode if mode == "eval" else "continuous_eval"


def _local(config):
  """The evaluator joins no cluster: a strategy of its own over its local devices
  (mirrored: every GPU, or runtime.num_cpu_devices) instead of a multi-worker one."""
  if config.runtime.strategy not in ("multi_worker_mirrored", "parameter_server"):
    return config
  config = config.copy_and_resolve_references()
  config.runtime.strategy = "mirrored"
  return config


def _tf_config_task() -> dict:
  """TF_CONFIG's task: the first reading of TF_CONFIG in a run, so the one place where a
  Kubernetes Indexed Job's pod gets the TF_CONFIG its index describes (if unset), for
  these checks and for the strategy's resolver after them."""
  import json  # pylint: disable=g-import-not-at-top
  kubernetes.export_tf_config()
  try:
    task = json.loads(os.environ.get("TF_CONFIG") or "{}").get("task") or {}
  except (ValueError, AttributeError):
    raise UserError("TF_CONFIG is not valid JSON (an object with \"cluster\" and "
                    "\"task\")") from None
  if not isinstance(task, dict):
    raise UserError(f"TF_CONFIG's \"task\" is not an object: {task!r}")
  return task
