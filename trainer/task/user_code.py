"""A user's Task failing in build() or while its steps trace: one line naming where
(UserError, exit 2), not a traceback through TensorFlow, Keras and distloop; and user
code at a loop boundary (an Action) run so that it cannot keep the job from ending
(`bounded`)."""
import os
import re
import threading
import time
import traceback
from typing import Callable

import input_pipelines
from trainer.errors import Preempted, UserError


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
  except Exception as e:  # pylint: disable=broad-except
    raise UserError(f"{type(task).__name__}'s step failed while tracing: {in_user_code(e)}"
                    ) from None


_NOT_USER_CODE = ("/tensorflow/", "/keras/", "/trainer/", "/autograph/", "/site-packages/",
                   "__autograph_generated")


def in_user_code(error: Exception) -> str:
  """`Type: first line (file:line)`, at the innermost frame outside TensorFlow, Keras
  and distloop's trainer/: where the user's code went wrong."""
  where = ""
  for frame in traceback.extract_tb(error.__traceback__):
    path = frame.filename
    if not any(part in path for part in _NOT_USER_CODE):
      where = f" ({os.path.basename(path)}:{frame.lineno})"
  lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
  if lines and lines[0] == "in user code:":  # autograph: the frames as text, then the error
    frames = [match for match in (re.search(r'File "(.+?)", line (\d+)', line) for line in lines)
              if match and not any(part in match.group(1) for part in _NOT_USER_CODE)]
    if frames:
      where = f" ({os.path.basename(frames[-1].group(1))}:{frames[-1].group(2)})"
    lines = [lines[-1].removeprefix(f"{type(error).__name__}: ")]
  return f"{type(error).__name__}: {lines[0][:300] if lines else ''}{where}"


_POLL_SECONDS = 0.05  # how often the main thread looks at the signal flag and the clock
SIGNAL_GRACE_SECONDS = 3.0  # after a signal, user code still running this long is left


class Abandoned(BaseException):
  """User code at a boundary was left running: a signal came (`signalled`) and it did not
  return within SIGNAL_GRACE_SECONDS, or it ran past its limit. A BaseException: no
  `except Exception` on the way up turns it into something else."""

  def __init__(self, what: str, *, signalled: bool, seconds: float):
    super().__init__(what)
    self.what, self.signalled, self.seconds = what, signalled, seconds


def bounded(function: Callable, *args, what: str, limit_seconds: float,
            stop_requested: Callable[[], bool]):
  """`function(*args)` in a daemon thread while this (main) thread keeps the signal
  protocol: returns its result or raises what it raised; raises Abandoned if it does
  not return within SIGNAL_GRACE_SECONDS of a signal, or within `limit_seconds` (0: no
  limit). A thread left behind may go on running: the caller ends the process (it holds
  no lock of the caller's; what it reads is the state of the boundary, which is saved)."""
  outcome = {}

  def call():
    try:
      outcome["value"] = function(*args)
    except BaseException as e:  # pylint: disable=broad-except  (re-raised in the caller)
      outcome["error"] = e

  thread = threading.Thread(target=call, name=f"distloop {what}", daemon=True)
  started = time.monotonic()
  signalled_at = None
  thread.start()
  while True:
    thread.join(_POLL_SECONDS)
    if not thread.is_alive():
      break
    now = time.monotonic()
    if signalled_at is None and stop_requested():
      signalled_at = now
    if signalled_at is not None and now - signalled_at >= SIGNAL_GRACE_SECONDS:
      raise Abandoned(what, signalled=True, seconds=now - started)
    if limit_seconds and now - started >= limit_seconds:
      raise Abandoned(what, signalled=False, seconds=now - started)
  if "error" in outcome:
    raise outcome["error"]
  return outcome.get("value")
