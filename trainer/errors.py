"""Errors that end a run with a specific exit code and one line on stderr, no traceback."""


class UserError(Exception):
  """Bad flag, config value or model_dir: exit 2, nothing written."""


class NonFiniteError(Exception):
  """The loss became NaN/Inf: exit 1; the non-finite state is never checkpointed."""
