"""The errors that end a run, and the one table of exit codes.

The CLI prints an error's message as one line on stderr (no traceback) and exits
with its code; the Python API (trainer.run) raises them with the same messages, a
refusal's flags in its own words (`in_api_words`).
"""
import re

EXIT_OK = 0          # done (re-running a finished job is a quick no-op that says so)
EXIT_FAILURE = 1     # anything else: a failed run (NonFiniteError, StorageError, a bug)
EXIT_BAD_INPUT = 2   # bad flag, config, plug-in, data or model_dir: nothing written
EXIT_PREEMPTED = 42  # stopped with the current step on disk: run the same command again
                     # (the default of --preempted_exit_code, for schedulers that retry only
                     # some codes: a Kubeflow TFJob's ExitCode policy retries >= 128)

_RESERVED = {EXIT_OK: "done", EXIT_FAILURE: "a failure", EXIT_BAD_INPUT: "bad input"}
_preempted_exit_code = EXIT_PREEMPTED  # what this process exits with when preempted


class UserError(Exception):
  """Bad flag, config value or model_dir: exit 2, nothing written."""


class NonFiniteError(Exception):
  """The loss became NaN/Inf: exit 1; the non-finite state is never checkpointed."""


class StorageError(Exception):
  """A write to model_dir failed (disk full, read-only, permission denied): exit 1.
  The message says what, where, and how much space was needed when known."""


class UserCodeError(Exception):
  """A user's Task or Action failed at run time (an assertion in its step, an Action
  raising): exit 1, one line naming it, the step, and the last checkpoint, which is
  intact (trainer/task/user_code.py). `saved_step`: the step it failed at, saved before
  the error was raised (an Action that called sys.exit)."""

  def __init__(self, message: str, *, saved_step: int | None = None):
    super().__init__(message)
    self.saved_step = saved_step

  def after_saves(self, last_step: int | None) -> "UserCodeError":
    """This error, its line ending with the run's last checkpoint (`last_step`), once
    the pending saves are on disk."""
    if last_step is None:
      return UserCodeError(f"{self}; no checkpoint yet: fix it and run the same command "
                           f"again")
    if last_step == self.saved_step:
      return UserCodeError(f"{self}; step {last_step} is saved: fix it and run the same "
                           f"command again to resume from there")
    return UserCodeError(f"{self}; the last checkpoint, step {last_step}, is intact: fix it "
                         f"and run the same command again to resume from there")


class UserCodeHung(Exception):
  """A user's Action did not return within train.action_timeout_seconds: exit 1, one line
  naming it, the step, and what is on disk."""


# How a worker's one line about a lost peer begins; the launcher reads it in the relayed
# output (a task that lost a peer is not the cause of a group failure:
# trainer/cluster/launch_tasks.py).
PEER_LOST = "lost a peer worker"


class PeerLost(Exception):
  """A multi-worker run's collective failed because a peer process is gone (killed,
  crashed, its machine lost): exit 1, one line naming the step, without a traceback
  (trainer/cluster/peers.py). This worker is not the cause: the launcher (or the
  cluster) says which one died, and restarts the group from the latest checkpoint."""


class Preempted(BaseException):
  """SIGTERM/SIGINT/SIGHUP: exit 42, run the same command again to resume.

  A BaseException, like KeyboardInterrupt: a signal during start-up raises it inside
  whatever runs then (a plug-in, Keras, a config's get_config), whose
  `except Exception` must not swallow it (trainer/cluster/preemption.py).

  `step`: the step whose checkpoint is on disk; None when stopped before training
  started (nothing new to save; `signal_name` then says which signal, if known).
  `unsaved`: why the checkpoint of `step` could not be written (then
  `last_complete` is where the next run resumes). `message`: what is on disk, said by
  a mode that saves no step (--mode=predict: the rows committed).
  """

  def __init__(self, step: int | None, *, unsaved: str = "", last_complete: int | None = None,
               signal_name: str = "", message: str = ""):
    if message:  # what is on disk, in another mode's words (--mode=predict's rows)
      pass
    elif step is None:
      message = (f"preempted during start-up{f' ({signal_name})' if signal_name else ''}, "
                 f"before training; nothing new to save: run the same command again to resume")
    elif unsaved:
      where = ("no checkpoint yet" if last_complete is None
               else f"the last complete checkpoint is step {last_complete}")
      message = (f"preempted at step {step}, but its checkpoint could not be written "
                 f"({unsaved}); {where}: run the same command again to resume from it")
    else:
      message = (f"preempted at step {step}; its checkpoint is on disk: run the same "
                 f"command again to resume")
    super().__init__(message)
    self.step = step


def check_preempted_exit_code(code) -> int:
  """The code as an int, or UserError: 3..255, as 0, 1 and 2 already mean something and
  a process exit status is one byte."""
  try:
    number = int(str(code).strip())
  except ValueError:
    raise UserError(f"--preempted_exit_code={code}: not an integer (3..255; default "
                    f"{EXIT_PREEMPTED})") from None
  if number in _RESERVED:
    raise UserError(f"--preempted_exit_code={number}: {number} already means "
                    f"{_RESERVED[number]}; use 3..255 (default {EXIT_PREEMPTED})")
  if not 3 <= number <= 255:
    raise UserError(f"--preempted_exit_code={number}: an exit status is 3..255 here "
                    f"(default {EXIT_PREEMPTED})")
  return number


def set_preempted_exit_code(code: int) -> None:
  """The code a preempted run of this process exits with (the CLI's flag)."""
  global _preempted_exit_code
  _preempted_exit_code = check_preempted_exit_code(code)


def preempted_exit_code() -> int:
  """EXIT_PREEMPTED unless --preempted_exit_code said otherwise."""
  return _preempted_exit_code


def preempted_exit_code_in(argv: list[str]) -> str | None:
  """The value of --preempted_exit_code in a command line (`=V` or a separate V), or
  None: read before the flags are parsed (a signal during start-up exits with it) and
  by the launcher, which passes the trainer's flags through."""
  value = None
  for i, arg in enumerate(argv):
    if arg == "--":
      break
    name, equals, rest = arg.partition("=")
    if name in ("--preempted_exit_code", "-preempted_exit_code"):
      value = rest if equals else (argv[i + 1] if i + 1 < len(argv) else "")
  return value


def exit_code(error: BaseException) -> int:
  """The exit code of a run that ended with `error`."""
  from input_pipelines.errors import DataError  # pylint: disable=g-import-not-at-top
  if isinstance(error, Preempted):
    return _preempted_exit_code
  if isinstance(error, (UserError, DataError)):
    return EXIT_BAD_INPUT
  return EXIT_FAILURE


def in_api_words(message: str) -> str:
  """A refusal's message, written once in the CLI's words (its flags), in the Python API's:
  `--model_dir=...`, `--mode=eval`, `--checkpoint_step=N`, `--config=NAME` are run()'s
  arguments (`model_dir=...`, `mode='eval'`, ...), `--config.FIELD=VALUE` a config field
  (`config.train.steps=100`, `config.checkpoint.allow_other_trajectory=True`). The one
  place the wording differs: the CLI (which calls api.execute, not run) keeps its flags."""
  message = re.sub(r"--config\.([\w.{}]+)=(true|false)\b",
                   lambda match: f"config.{match[1]}={match[2].capitalize()}", message)
  message = re.sub(r"--mode=(\w+)", r"mode='\1'", message)
  return re.sub(r"--(?=(?:config|model_dir|mode|checkpoint_step)\b)", "", message)
