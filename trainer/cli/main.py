"""`python -m trainer --config=NAME --model_dir=DIR [--mode=MODE] [--config.FIELD=VALUE ...]`

The command line over the Python API (trainer/api.py, where the order of the
checks is): SIGTERM/SIGINT/SIGHUP are caught before anything else (by
trainer/__main__.py, before it imports this module; a signal at any moment is a
request to stop, trainer/cluster/preemption.py; during start-up it ends the run
within seconds, a hung plug-in or config included); then the flags and the
config (chosen and loaded by trainer/cli/config_file.py), then api.execute. Each
error it raises becomes one line on stderr and the exit code of
trainer/errors.py's table: 0 done, 1 failure, 2 bad input, 42 preempted (or
--preempted_exit_code, read from the command line first thing: a signal during
start-up exits with it too).
"""
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
from trainer import api
from trainer.cli import config_file
from trainer.cli import logs
from trainer.cluster import preemption
from trainer.loop import continuous_eval
from trainer.loop import progress
from trainer.store import files
from trainer.store import mirror
from trainer.store import model_dir as layout
from trainer.setup import epochs
from trainer import errors
from trainer.errors import EXIT_BAD_INPUT, EXIT_FAILURE, EXIT_OK, EXIT_PREEMPTED
from trainer.errors import NonFiniteError, PeerLost, Preempted, StorageError, UserCodeError
from trainer.errors import UserCodeHung
from trainer.errors import UserError
from trainer.errors import exit_code

MODES = api.MODES

# No default here: trainer/cli/config_file.py chooses it (a model_dir's config.json, or
# synthetic) and inserts it, so that a config always loads through its Parser.
_CONFIG = config_flags.DEFINE_config_file(
    "config", default=None, lock_config=True,
    help_string=f"a config name ({', '.join(configs.NAMES)}), a path to a config file, or a "
                f"model_dir's config.json; default: model_dir's config.json if there is one, "
                f"else synthetic")
flags.FLAGS["config"].parser = config_file.Parser(lock_config=True)
_config_used = ""  # which config this run uses, in words (set by parse_flags)
_command_used = ""  # this run's command, copy-pasteable: its config and every flag as typed
_MODEL_DIR = flags.DEFINE_string("model_dir", None, "where checkpoints, summaries and exports go",
                                 required=True)
_MODE = flags.DEFINE_enum("mode", "train", MODES, "what to do in model_dir")
_CHECKPOINT_STEP = flags.DEFINE_integer(
    "checkpoint_step", None, "--mode=eval: evaluate this checkpoint step instead of the latest",
    lower_bound=0)
# Read by run() before the flags are parsed (errors.preempted_exit_code_in); defined here
# for --help and so that absl accepts it.
flags.DEFINE_string(
    "preempted_exit_code", str(EXIT_PREEMPTED),
    f"the exit code of a run stopped by SIGTERM/SIGINT/SIGHUP with its step on disk (3..255; "
    f"default {EXIT_PREEMPTED}): e.g. 143 for a scheduler that retries only codes >= 128 "
    f"(a Kubeflow TFJob's restartPolicy ExitCode)")


def main(argv):
  if len(argv) > 1:
    fail(EXIT_BAD_INPUT, f"unexpected arguments: {' '.join(argv[1:])}")
  logs.quiet_libraries()
  # Each failure leaves inside its except block, without the interpreter's teardown
  # (`_leave`): its traceback holds the loop's frames and their tf.data iterators, whose
  # teardown waits for tf.data's threads (seconds, or a deadlock on the GIL when their
  # reads run in tf.numpy_function).
  try:
    _leave(_run(config_from_flags(), _MODEL_DIR.value, _MODE.value, _CHECKPOINT_STEP.value))
  except Preempted as e:
    _report_preempted(e)
    _leave(errors.preempted_exit_code())
  except Exception as e:  # pylint: disable=broad-except
    error = api.translate(e) or e
    code = exit_code(error)
    if code == EXIT_FAILURE and error is e and not _one_line(e):
      traceback.print_exc()
      _leave(code)
    fail(code, str(error), immediately=True)


def _leave(code: int) -> None:
  """Exits now that every file of the run is written and closed (the Trainer closed its
  checkpoints and event files; JSON files are fsynced when written). An interpreter
  exit would first tear down tf.data's iterators and their threads, 20-80 s on a
  busy machine (issue 31), and a thread of a user's Action left running could hold it
  forever: nothing is left to do that must wait for them."""
  progress.finish()
  mirror.remove_staging()  # a bucket model_dir's local copy: everything is in the bucket
  for handler in logging.get_absl_logger().handlers + [logging.get_absl_handler()]:
    handler.flush()
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(code)  # pylint: disable=protected-access


def _one_line(error: Exception) -> bool:
  """Errors whose message is the whole story (no traceback)."""
  return isinstance(error, (UserError, input_pipelines.DataError, NonFiniteError,
                            continuous_eval.Unfinished, StorageError, UserCodeError,
                            UserCodeHung, PeerLost))


def _run(config, model_dir: str, mode: str, checkpoint_step: int | None = None) -> int:
  if api.is_parameter_server_task(config):
    with logs.native_startup_silenced():
      api.check_config(config)
    preemption.end_start_up()  # a server polls the flag
    return _serve()
  mode = api.task_mode(mode)  # an evaluator task evaluates, whatever the shared command says
  result = api.execute(config, model_dir, mode, checkpoint_step, config_source=_config_used)
  if mode in ("train", "train_and_eval"):
    if result.get("already_finished"):
      print(mirror.display(f"Already finished at step {result['step']} in {model_dir}; "
                           f"nothing to do (summary: {layout.summary_path(model_dir)})."))
    else:
      _log_summary(result, model_dir)
  elif mode == "eval":
    print(files.json_text(result, "the eval result"))
  elif mode == "export":
    print(mirror.display(result))  # a bucket's export by its URL, not the staging path
  elif mode == "predict":
    print(files.json_text(result, "the predictions' summary"))
  return EXIT_OK


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
  speed = ("no step trained in this process (resumed at the final step): as logged there"
           if summary.get("trained_steps") == 0
           else f"{summary['examples_per_sec']:.0f} examples/s (steady state)")
  # Only what happened: a Task without eval_step evaluates nothing, one without export()
  # exports nothing (no row, no folder named for them).
  evaluated = bool(summary["eval_examples"])
  lines = [f"Done at step {summary['step']} ({summary['strategy']}, "
           f"{summary['num_replicas']} replica(s)):"]
  if evaluated:
    lines.append(f"  eval      {values('eval')} | {summary['eval_examples']} examples")
  lines += [
      f"  train     {values('train')} | {speed}",
      f"  time      {summary['wall_time_sec']:.1f} s: training {summary['train_time_sec']:.1f} s"
      + (f", eval {summary['eval_time_sec']:.1f} s" if evaluated else "")
      + f", checkpoints blocked {summary['checkpoint_time_sec']:.2f} s",
      f"  outputs   {os.path.abspath(model_dir)} "
      f"({', '.join(_outputs(model_dir, summary['step']))})",
      f"  config    {_command_used}"]
  logging.info("%s", "\n".join(lines))


def _outputs(model_dir: str, step: int) -> list[str]:
  """The run's outputs that are in model_dir (a Task exporting nothing has no export/)."""
  return [name for name, path in (
      ("summary.json", layout.summary_path(model_dir)),
      (f"export/{step}/", layout.export_dir(model_dir, step)),
      ("checkpoints/", layout.checkpoint_dir(model_dir)),
      ("tensorboard/", layout.tensorboard_dir(model_dir))) if os.path.exists(path)]


def _serve() -> int:
  """Runs this task's gRPC server until the launcher (or the cluster manager) stops it."""
  with logs.native_startup_silenced():
    from trainer.cluster import runtime  # pylint: disable=g-import-not-at-top
    resolver = runtime.cluster_resolver(_CONFIG.value.runtime)
  logging.info("Serving as %s %d of the parameter-server cluster", resolver.task_type,
               resolver.task_id)
  server = runtime.serve(resolver)
  preemption.install()  # again, as after any runtime start
  while not preemption.requested():  # the server runs in its own threads
    preemption.sleep(1.0)
  logging.warning("stopped serving (%s); the chief owns the state", server.target)
  return errors.preempted_exit_code()


def config_from_flags():
  try:
    config = _CONFIG.value
    config.lock()  # touching the config surfaces a load failure here
  except (IOError, AttributeError) as e:
    raise UserError(f"cannot load --config: {str(e).splitlines()[0]}") from None
  epochs.one_length(config, overridden=_overridden_fields(sys.argv[1:]))
  return config


def _overridden_fields(argv: list[str]) -> set[str]:
  """The config fields a `--config.FIELD=VALUE` (or `--config.FIELD VALUE`) sets."""
  return {arg.lstrip("-").split("=", 1)[0].removeprefix("config.") for arg in argv
          if arg.lstrip("-").startswith("config.")}


def parse_flags(argv: list[str]) -> list[str]:
  global _config_used, _command_used
  try:
    resolved, _config_used = config_file.choose(argv)
    _command_used = config_file.command(argv, resolved)
    return flags.FLAGS(resolved)
  except config_file.ConfigFileError as e:
    fail(EXIT_BAD_INPUT, e)
  except StorageError as e:  # a bucket that kept failing while its model_dir was staged
    fail(EXIT_FAILURE, e)
  except flags.Error as e:
    fail(EXIT_BAD_INPUT, e)
  except (AttributeError, KeyError) as e:  # ml_collections: an override names no field
    text = str(e).replace("\\", "")
    key = re.search(r"'([^']+)'", text)
    key = key.group(1) if key else text
    overrides = [arg.split("=", 1)[0] for arg in argv if arg.lstrip("-").startswith("config.")]
    named = [flag for flag in overrides if key in flag.split(".")[1:]]
    hint = re.search(r'Did you mean "([^"]+)"', text)
    fail(EXIT_BAD_INPUT, f"unknown config field {named[0] if named else key}"
                          + (f" (did you mean {hint.group(1)!r}?)" if hint else
                             " (configs/common.py lists every field)"))


def fail(code: int, error, immediately: bool = False) -> None:
  """One line on stderr, no traceback."""
  message = mirror.display(" ".join(str(error).split()))
  print(f"distloop: error: {message}", file=sys.stderr)
  if immediately:
    _leave(code)
  sys.exit(code)


def _report_preempted(stop: Preempted) -> None:
  """The run's one line about the stop (a start-up watchdog then adds none). Before the
  flags are parsed absl would add a line of its own: then it is printed plainly."""
  if flags.FLAGS.is_parsed():
    logging.warning("%s", stop)
  else:
    print(f"distloop: {mirror.display(str(stop))}", file=sys.stderr, flush=True)
  preemption.reported()


def run() -> None:
  preemption.install(start_up=True)  # before flags, TensorFlow or any write: no bare signal death
  code = errors.preempted_exit_code_in(sys.argv[1:])
  if code is not None:
    try:  # first: a signal from now on exits with it
      errors.set_preempted_exit_code(code)
    except UserError as e:
      fail(EXIT_BAD_INPUT, e)
  try:
    preemption.start_up()  # a config's get_config or a plug-in may block: a signal ends it
    app.run(main, flags_parser=parse_flags)
  except Preempted as e:  # before main(): while the flags (and so the config file) load
    _report_preempted(e)
    sys.exit(errors.preempted_exit_code())

