"""A user's Task or Action failing: one line naming where, not a traceback through
TensorFlow, Keras and distloop; and user code at a loop boundary (an Action) run so
that it cannot keep the job from ending (trainer/cluster/preemption.py `bounded`).

In build(), while its steps trace, or in what it exports (checked with the probe
batch before step 1, so that a run cannot fail the same way after every training):
UserError, exit 2, nothing written (sys.exit there too). At run time (an assertion in
the compiled step, an Action raising at a boundary or a phase): UserCodeError, exit 1,
naming the Task or Action and the step; the run's checkpoints stay as they are
(trainer/api.py adds the last one to the line once the pending saves are on disk). An
Action calling sys.exit is one too, its step saved first (`action_exited`).
"""
import contextlib
import os
import re
import traceback

import input_pipelines
from trainer.errors import NonFiniteError, Preempted, StorageError, UserCodeError, UserCodeHung
from trainer.errors import UserError

_DISTLOOP_ERRORS = (UserError, input_pipelines.DataError, NonFiniteError, StorageError,
                    UserCodeError, UserCodeHung)


def build(task, context) -> None:
  """task.build(context); a user's task failing is one line naming it (UserError)."""
  try:
    task.build(context)
  except (UserError, input_pipelines.DataError, Preempted):
    raise
  except SystemExit as e:
    raise UserError(f"{type(task).__name__}.build called sys.exit({e.code})") from None
  except Exception as e:  # pylint: disable=broad-except  (user code raises anything)
    raise UserError(f"{type(task).__name__}.build raised {in_user_code(e)}") from None


def traced(discover, task):
  """Runs a step's trace; a user's step failing at trace time is one line naming where."""
  try:
    return discover()
  except UserError as e:  # raised in the trace: autograph prefixes its frames
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    if lines and lines[0] == "in user code:":
      raise UserError(lines[-1].removeprefix("UserError: ")) from None
    raise
  except Preempted:
    raise
  except SystemExit as e:  # would end the run with its code, untrained and unsaid
    raise UserError(f"{type(task).__name__}'s step called sys.exit({e.code!r}) while "
                    f"tracing; a step must return its values or raise") from None
  except Exception as e:  # pylint: disable=broad-except
    raise UserError(f"{type(task).__name__}'s step failed while tracing: {in_user_code(e)}"
                    ) from None


@contextlib.contextmanager
def running(what: str, when: str):
  """Runs a compiled loop of the user's `what` ("Gan.train_step") `when` ("in steps
  3..4"): a TensorFlow op failing in it (a tf.debugging.assert_*, a value TensorFlow
  cannot compute) is one line (UserCodeError). Bad input wrapped by tf.data (a
  DataError raised by a source) stays what trainer/api.py translates it into."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  try:
    yield
  except (tf.errors.InvalidArgumentError, tf.errors.UnimplementedError) as e:
    if "DataError: " in str(e) or "deterministic XLA" in str(e):  # api.translate's
      raise
    raise UserCodeError(f"{what} failed {when}: {in_user_code(e)}") from None


def action_failed(name: str, step: int, error: Exception) -> None:
  """An Action's function raised `error` at `step`: re-raised as it is when it is
  distloop's own (or no frame is the user's: a bug of distloop's, with its traceback),
  else as one line naming the action (UserCodeError)."""
  if isinstance(error, _DISTLOOP_ERRORS) or not _user_frame(error):
    raise error
  raise UserCodeError(f"action {name!r} raised {in_user_code(error)} at step {step}") from None


def action_exited(name: str, step: int, exited: SystemExit, *, saved: bool) -> UserCodeError:
  """An Action's function called sys.exit (or exit()) at `step`: exit 0 would say "done"
  with nothing finished, any other code a failure without a word. One line (exit 1)
  naming it, where, and the way to end training it meant; `saved`: `step` is on disk."""
  return UserCodeError(
      f"action {name!r} called sys.exit({exited.code!r}) at step {step}{location(exited)}: an "
      f"Action cannot end the run (return 'stop' to finish training at this step, or raise "
      f"to fail it)", saved_step=step if saved else None)


def _user_frame(error: Exception) -> bool:
  return any(not any(part in frame.filename for part in _NOT_USER_CODE)
             for frame in traceback.extract_tb(error.__traceback__))


_NOT_USER_CODE = ("/tensorflow/", "/keras/", "/trainer/", "/autograph/", "/site-packages/",
                  "__autograph_generated", "<frozen ")


def location(error: BaseException) -> str:
  """` (file:line)` of the innermost frame outside TensorFlow, Keras and distloop's
  trainer/ in `error`'s traceback, "" if none is: where the user's code went wrong."""
  found = ""
  for frame in traceback.extract_tb(error.__traceback__):
    if not any(part in frame.filename for part in _NOT_USER_CODE):
      found = f" ({os.path.basename(frame.filename)}:{frame.lineno})"
  return found


def in_user_code(error: Exception) -> str:
  """`Type: first line (file:line)`, at the innermost frame outside TensorFlow, Keras
  and distloop's trainer/: where the user's code went wrong."""
  where = location(error)
  lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
  if lines and lines[0] in ("in user code:", "Graph execution error:"):
    # autograph: the frames as text, then the error; a failed op: the frames where it
    # was defined, then its message and the node ("[[{{node ...}}]]").
    found = [(i, re.search(r'File "(.+?)", line (\d+)', line)) for i, line in enumerate(lines)]
    found = [(i, match) for i, match in found if match]
    frames = [match for _, match in found
              if not any(part in match.group(1) for part in _NOT_USER_CODE)]
    if frames:
      where = f" ({os.path.basename(frames[-1].group(1))}:{frames[-1].group(2)})"
    if lines[0] == "in user code:":  # from the error's own line on
      starts = [i for i, line in enumerate(lines) if line.startswith(f"{type(error).__name__}: ")]
      lines = lines[starts[-1]:] if starts else lines[-1:]
    else:
      lines = [line for line in lines[found[-1][0] + 1 if found else 1:]
               if not line.startswith("[[")] or lines[-1:]
    lines[0] = lines[0].removeprefix(f"{type(error).__name__}: ")
  lines = [re.sub(r"\x1b\[[0-9;]*m", "", line) for line in lines]
  if len(lines) > 1 and lines[0].startswith("Exception encountered when calling"):
    lines = lines[1:]  # Keras: the layer's own error is the next line
  return f"{type(error).__name__}: {lines[0][:300] if lines else ''}{where}"


SIGNAL_GRACE_SECONDS = 3.0  # after a signal, an Action still running this long is left
