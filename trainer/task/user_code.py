"""A user's Task failing in build() or while its steps trace: one line naming where
(UserError, exit 2), not a traceback through TensorFlow, Keras and distloop."""
import os
import re
import traceback

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
