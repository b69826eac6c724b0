"""Errors that end a run with a specific exit code and one line on stderr, no traceback."""


class UserError(Exception):
  """Bad flag, config value or model_dir: exit 2, nothing written."""


class NonFiniteError(Exception):
  """The loss became NaN/Inf: exit 1; the non-finite state is never checkpointed."""


class Preempted(Exception):
  """SIGTERM/SIGINT: a checkpoint of the current step is on disk; exit 42 and run again."""

  def __init__(self, step: int):
    super().__init__(f"preempted at step {step}; its checkpoint is on disk: run the same "
                     f"command again to resume")
    self.step = step
