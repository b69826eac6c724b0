"""Experiment configs: one Python file per experiment, each with `get_config()`.

`--config=NAME` on the command line names a file here; a path to any other
config file (`--config=path/to/my_config.py`) works too.
"""
import os

NAMES = ("synthetic", "mnist_cnn", "tabular", "regression", "image_folder", "recommender")


def path_of(name: str) -> str:
  """The file that defines config `name`."""
  return os.path.join(os.path.dirname(os.path.abspath(__file__)), f"{name}.py")


def get(name: str):
  """The built-in config `name` (a fresh, locked ConfigDict: `unlock()` to add fields;
  setting existing ones needs no unlock). A misspelt field, set or read, raises
  configs.fields.UnknownField in one line, as the command line says it (`unknown config
  field train.stepz (did you mean 'steps'?)`), not ml_collections' list of the fields."""
  if name not in NAMES:
    raise ValueError(f"no built-in config {name!r} (one of {', '.join(NAMES)})")
  import importlib  # pylint: disable=g-import-not-at-top
  from configs import fields  # pylint: disable=g-import-not-at-top
  return fields.with_one_line_errors(importlib.import_module(f"configs.{name}").get_config())
