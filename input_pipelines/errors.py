"""The one error an input pipeline raises for bad data: the trainer turns it into exit 2."""


class DataError(ValueError):
  """Missing, corrupt or inconsistent data files; the message names the file."""
