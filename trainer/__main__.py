"""`python -m trainer --config=NAME --model_dir=DIR [--mode=MODE] [--config.FIELD=VALUE ...]`

Order matters here: SIGTERM/SIGINT/SIGHUP are caught before anything else (a signal
at any moment is a request to stop, trainer/preemption.py; during start-up it ends
the run within seconds, a hung plug-in or config included); flags, config (chosen
and loaded by trainer/config_file.py; a resume's changes checked by
trainer/config_changes.py), model_dir's shape and data are checked before
TensorFlow is imported and before anything is written, so bad
input costs a second and leaves model_dir untouched; then, with the runtime up,
the batch sizes against the splits and the memory available
(input_pipelines/memory.py) and a tf.data stream's element spec; the writer
lock on model_dir is taken only then (trainer/writer_lock.py). Exit codes: 0 done, 1 failure, 2 bad
input, 42 preempted.
"""
if __name__ == "__main__":  # first of all, before the heavier imports below
  from trainer import preemption as _early  # pylint: disable=g-import-not-at-top
  _early.install(start_up=True)

import contextlib  # pylint: disable=g-import-not-at-top,wrong-import-position
import json
import os
import re
import sys
import traceback

from absl import app
from absl import flags
from absl import logging
from ml_collections import config_flags

import configs
import input_pipelines
from input_pipelines import memory
from trainer import config_changes
from trainer import config_file
from trainer import continuous_eval
from trainer import logs
from trainer import outputs
from trainer import plugins
from trainer import preemption
from trainer import validation
from trainer import writer_lock
from trainer.errors import NonFiniteError, Preempted, StorageError, UserError

MODES = ("train", "eval", "train_and_eval", "continuous_eval", "export")
EXIT_OK, EXIT_FAILURE, EXIT_BAD_INPUT, EXIT_PREEMPTED = 0, 1, 2, 42

# No default here: trainer/config_file.py chooses it (a model_dir's config.json, or
# synthetic) and inserts it, so that a config always loads through its Parser.
_CONFIG = config_flags.DEFINE_config_file(
    "config", default=None, lock_config=True,
    help_string=f"a config name ({', '.join(configs.NAMES)}), a path to a config file, or a "
                f"model_dir's config.json; default: model_dir's config.json if there is one, "
                f"else synthetic")
flags.FLAGS["config"].parser = config_file.Parser(lock_config=True)
_config_used = ""  # which config this run uses, in words (set by _parse_flags)
_MODEL_DIR = flags.DEFINE_string("model_dir", None, "where checkpoints, summaries and exports go",
                                 required=True)
_MODE = flags.DEFINE_enum("mode", "train", MODES, "what to do in model_dir")
_CHECKPOINT_STEP = flags.DEFINE_integer(
    "checkpoint_step", None, "--mode=eval: evaluate this checkpoint step instead of the latest",
    lower_bound=0)


def main(argv):
  if len(argv) > 1:
    _fail(EXIT_BAD_INPUT, f"unexpected arguments: {' '.join(argv[1:])}")
  logs.quiet_libraries()
  # Each failure is turned into (code, line) inside its except block and the process
  # exits after it: a live traceback can hold a tf.data iterator whose reads run in
  # tf.numpy_function, and one still alive when the interpreter finalizes can
  # deadlock the exit (its thread waits for the GIL forever).
  immediately = False
  try:
    return _run(_load_config(), _MODEL_DIR.value, _MODE.value, _CHECKPOINT_STEP.value)
  except (UserError, input_pipelines.DataError) as e:
    code, line = EXIT_BAD_INPUT, str(e)
  except (NonFiniteError, continuous_eval.Unfinished, StorageError) as e:
    code, line = EXIT_FAILURE, str(e)
  except Preempted as e:
    _report_preempted(e)
    code, line = EXIT_PREEMPTED, None
  except Exception as e:  # pylint: disable=broad-except
    data_error = _data_error_inside(e)
    if _XLA_NOT_DETERMINISTIC in str(e):
      code, line = EXIT_BAD_INPUT, (
          "runtime.jit_compile=true cannot be runtime.deterministic=true for this model: XLA "
          f"has no deterministic kernel for one of its ops ({_first_op_line(str(e))}); set "
          "one of them to false")
    elif data_error is not None:
      # tf.data threads may still be inside the source's __getitem__: leave at once.
      code, line, immediately = EXIT_BAD_INPUT, data_error, True
    else:
      traceback.print_exc()
      code, line = EXIT_FAILURE, None
  if line is not None:
    _fail(code, line, immediately=immediately)
  sys.exit(code)


def _run(config, model_dir: str, mode: str, checkpoint_step: int | None = None) -> int:
  with logs.native_startup_silenced():  # a plug-in module may import TensorFlow
    validation.check_config(config)
  outputs.check_layout(model_dir)
  if checkpoint_step is not None and mode != "eval":
    raise UserError(f"--checkpoint_step applies to --mode=eval only, not --mode={mode}")
  if _is_parameter_server_task(config):
    preemption.end_start_up()  # a server polls the flag
    return _serve()
  _stop_if_signalled(config)
  if mode in ("train", "train_and_eval"):
    config_changes.check(model_dir, config.to_dict())  # a changed seed is no "already finished"
    step = outputs.finished_step(model_dir, config.train.steps, config.to_dict())
    if step is not None:
      print(f"Already finished at step {step} in {model_dir}; nothing to do "
            f"(summary: {outputs.summary_path(model_dir)}).")
      return EXIT_OK
  # Data before the runtime: bad files fail before TensorFlow starts. (Keras's
  # download path does import TensorFlow, hence the silenced start-up lines.)
  with logs.native_startup_silenced():
    splits = plugins.load_data(config.data, config.runtime.seed)
    from input_pipelines import batching  # pylint: disable=g-import-not-at-top  (TensorFlow)
    from trainer import loop  # pylint: disable=g-import-not-at-top
    from trainer import runtime  # pylint: disable=g-import-not-at-top
    if config.runtime.strategy == "multi_worker_mirrored":
      preemption.end_start_up()  # from the runtime on, workers stop together (agreed)
    runtime.configure(config.runtime)
    strategy = runtime.create_strategy(config.runtime)
    runtime.seed(config.runtime)
  preemption.install()  # again: a multi-worker runtime installs a SIGTERM handler of its own
  runtime.check_batch_divisible(strategy, config.train.global_batch_size)
  training = mode in ("train", "train_and_eval")
  memory.check_batches(*splits, train_batch=config.train.global_batch_size if training else None,
                       eval_batch=config.eval.global_batch_size,
                       processes=runtime.num_workers(strategy))
  for source in splits:  # a tf.data stream's elements: fixed-shape examples, one label
    if isinstance(source, input_pipelines.StreamSource):
      batching.example_spec(source)
  _stop_if_signalled(config)

  with (_writer(model_dir) if training and runtime.is_chief(strategy)
        else contextlib.nullcontext()):
    return _run_mode(config, model_dir, mode, checkpoint_step, strategy, splits)


def _run_mode(config, model_dir: str, mode: str, checkpoint_step: int | None, strategy,
              splits) -> int:
  from trainer import loop  # pylint: disable=g-import-not-at-top
  training = mode in ("train", "train_and_eval")
  trainer = loop.Trainer(config, model_dir, strategy, splits, read_only=not training)
  preemption.end_start_up()  # built: from the restore on, stop at safe (agreed) points
  try:
    if training:
      summary = trainer.train(eval_interval=config.eval.interval if mode == "train_and_eval" else 0)
      _log_summary(summary, model_dir)
      return EXIT_OK
    # Which config a mode used: logged once past the refusals that are one line alone.
    if mode == "continuous_eval":
      logging.info("continuous_eval with %s", _config_used)
      continuous_eval.ContinuousEval(
          trainer, final_step=config.train.steps, poll_seconds=config.eval.poll_seconds,
          timeout_seconds=config.eval.timeout_seconds, sleep=preemption.sleep,
          stopped=preemption.requested).run()
      return EXIT_OK
    position = (trainer.restore_latest() if checkpoint_step is None
                else _restore_step(trainer, checkpoint_step))
    if position is None:
      raise UserError(f"no checkpoint in {outputs.checkpoint_dir(model_dir)}; train first")
    if preemption.requested():  # eval and export are single-process: decide locally
      raise Preempted(position.step)
    logging.info("%s of step %d with %s", mode, position.step, _config_used)
    if mode == "eval":
      result = trainer.evaluate(position.step)
      print(json.dumps({"step": position.step, **result}))
    elif mode == "export":
      print(trainer.export(position.step))
    return EXIT_OK
  finally:
    trainer.close()


@contextlib.contextmanager
def _writer(model_dir: str):
  """Holds the model_dir lock for the block (the chief of train/train_and_eval only).

  Taken after every check that needs no model (so a refused run never creates
  model_dir); a refusal inside the block (another model's checkpoint, bad data found
  by the model's checks or in training), or a signal before training (a hung model
  builder: trainer/preemption.py), removes the lock file, and model_dir if taking the
  lock created it and it holds no results. With the lock held, unfinished orbax
  temporaries cannot be another live writer's: they are removed. A directory that
  cannot be written fails here (exit 1), not at the first save after training.
  """
  from trainer import checkpoints  # pylint: disable=g-import-not-at-top  (imports orbax)
  lock = writer_lock.WriterLock.acquire(model_dir)
  refused = False
  try:
    with preemption.undone_on_forced_exit(lambda: lock.release(refused=True)):
      outputs.check_writable(model_dir)
      for directory in (outputs.checkpoint_dir(model_dir),
                        outputs.best_checkpoint_dir(model_dir)):
        removed = checkpoints.remove_temporaries(directory)
        if removed:
          logging.info("Removed %d unfinished checkpoint(s) a killed save left in %s: %s",
                       len(removed), directory, ", ".join(removed))
      yield lock
  except Exception as e:  # pylint: disable=broad-except  (re-raised)
    refused = _is_bad_input(e) and not outputs.holds_results(model_dir)
    raise
  except Preempted as e:  # stopped before training: leave model_dir as a refusal does
    refused = e.step is None and not outputs.holds_results(model_dir)
    raise
  finally:
    lock.release(refused=refused)


def _is_bad_input(error: Exception) -> bool:
  """Whether main() reports `error` as bad input (exit 2)."""
  return (isinstance(error, (UserError, input_pipelines.DataError))
          or _data_error_inside(error) is not None or _XLA_NOT_DETERMINISTIC in str(error))


def _stop_if_signalled(config) -> None:
  """Start-up of a single process: a signal so far ends the run now, exit 42 (nothing
  trained, nothing to save). Multi-worker jobs wait for the first agreed check, right
  after the restore (a worker leaving alone would hang the others in a collective)."""
  if preemption.requested() and config.runtime.strategy != "multi_worker_mirrored":
    raise Preempted(None)


def _restore_step(trainer, step: int):
  """--checkpoint_step=N: the position of step N once loaded; exit 2 naming the steps
  there are if N is not one of them."""
  available = trainer.checkpoints.all_steps()
  if step not in available:
    raise UserError(f"--checkpoint_step={step}: no such checkpoint in "
                    f"{trainer.checkpoints.directory} (available steps: "
                    f"{', '.join(map(str, available)) or 'none'})")
  position = trainer.restore(step)
  if position is None:
    raise UserError(f"--checkpoint_step={step}: "
                    f"{os.path.join(trainer.checkpoints.directory, str(step))} cannot be read")
  return position


def _log_summary(summary: dict, model_dir: str) -> None:
  """The final block: what a user reads first when the job ends."""
  def values(split):
    names = [key[len(split) + 1:] for key in summary
             if key.startswith(split + "_") and isinstance(summary[key], (float, type(None)))
             and not key.endswith("_sec")
             and not (key.endswith("regularization_loss") and not summary[key])]  # none
    def value(name):
      number = summary[f"{split}_{name}"]
      return float("nan") if number is None else number
    return " | ".join(f"{name} {value(name):.4f}"
                      for name in sorted(names, key=lambda n: n != "loss"))
  logging.info(
      "Done at step %d (%s, %d replica(s)):\n"
      "  eval      %s | %d examples\n"
      "  train     %s | %.0f examples/s (steady state)\n"
      "  time      %.1f s: training %.1f s, eval %.1f s, checkpoints blocked %.2f s\n"
      "  outputs   %s (summary.json, export/, checkpoints/, tensorboard/)\n"
      "  config    %s",
      summary["step"], summary["strategy"], summary["num_replicas"], values("eval"),
      summary["eval_examples"], values("train"), summary["examples_per_sec"],
      summary["wall_time_sec"], summary["train_time_sec"], summary["eval_time_sec"],
      summary["checkpoint_time_sec"], os.path.abspath(model_dir), _config_used)


_XLA_NOT_DETERMINISTIC = "do not yet have a deterministic XLA implementation"


def _first_op_line(text: str) -> str:
  return next((line.strip() for line in text.splitlines() if _XLA_NOT_DETERMINISTIC in line),
              "")[:200]


def _data_error_inside(error: Exception) -> str | None:
  """A DataError raised by a source's __getitem__ inside tf.data reaches us wrapped in a
  TensorFlow error: its one line, or None if `error` is something else."""
  match = re.search(r"DataError: (.+)", str(error))
  return match.group(1).strip() if match else None


def _is_parameter_server_task(config) -> bool:
  """A worker or ps task of a parameter-server cluster (TF_CONFIG): it serves, the
  chief trains. Read without TensorFlow, before the finished-job check."""
  if config.runtime.strategy != "parameter_server":
    return False
  try:
    task = json.loads(os.environ.get("TF_CONFIG") or "{}").get("task", {})
  except ValueError:
    raise UserError("TF_CONFIG is not valid JSON") from None
  return task.get("type") in ("worker", "ps")


def _serve() -> int:
  """Runs this task's gRPC server until the launcher (or the cluster manager) stops it."""
  with logs.native_startup_silenced():
    from trainer import runtime  # pylint: disable=g-import-not-at-top
    resolver = runtime.cluster_resolver(_CONFIG.value.runtime)
  logging.info("Serving as %s %d of the parameter-server cluster", resolver.task_type,
               resolver.task_id)
  server = runtime.serve(resolver)
  preemption.install()  # again, as after any runtime start
  while not preemption.requested():  # the server runs in its own threads
    preemption.sleep(1.0)
  logging.warning("stopped serving (%s); the chief owns the state", server.target)
  return EXIT_PREEMPTED


def _load_config():
  try:
    config = _CONFIG.value
    config.lock()  # touching the config surfaces a load failure here
  except (IOError, AttributeError) as e:
    raise UserError(f"cannot load --config: {str(e).splitlines()[0]}") from None
  return config


def _parse_flags(argv: list[str]) -> list[str]:
  global _config_used
  try:
    resolved, _config_used = config_file.choose(argv)
    return flags.FLAGS(resolved)
  except config_file.ConfigFileError as e:
    _fail(EXIT_BAD_INPUT, e)
  except flags.Error as e:
    _fail(EXIT_BAD_INPUT, e)
  except (AttributeError, KeyError) as e:  # ml_collections: an override names no field
    text = str(e).replace("\\", "")
    key = re.search(r"'([^']+)'", text)
    key = key.group(1) if key else text
    overrides = [arg.split("=", 1)[0] for arg in argv if arg.lstrip("-").startswith("config.")]
    named = [flag for flag in overrides if key in flag.split(".")[1:]]
    hint = re.search(r'Did you mean "([^"]+)"', text)
    _fail(EXIT_BAD_INPUT, f"unknown config field {named[0] if named else key}"
                          + (f" (did you mean {hint.group(1)!r}?)" if hint else
                             " (configs/common.py lists every field)"))


def _fail(code: int, error, immediately: bool = False) -> None:
  """One line on stderr, no traceback."""
  message = " ".join(str(error).split())
  print(f"distloop: error: {message}", file=sys.stderr)
  if immediately:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # pylint: disable=protected-access
  sys.exit(code)


def _report_preempted(stop: Preempted) -> None:
  """The run's one line about the stop (a start-up watchdog then adds none). Before the
  flags are parsed absl would add a line of its own: then it is printed plainly."""
  if flags.FLAGS.is_parsed():
    logging.warning("%s", stop)
  else:
    print(f"distloop: {stop}", file=sys.stderr, flush=True)
  preemption.reported()


def run() -> None:
  preemption.install(start_up=True)  # before flags, TensorFlow or any write: no bare signal death
  try:
    preemption.start_up()  # a config's get_config or a plug-in may block: a signal ends it
    app.run(main, flags_parser=_parse_flags)
  except Preempted as e:  # before main(): while the flags (and so the config file) load
    _report_preempted(e)
    sys.exit(EXIT_PREEMPTED)


if __name__ == "__main__":
  run()
