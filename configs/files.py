"""A config file, loaded: `load(FILE[:ARG])` runs its get_config() (with ARG if given),
and each way a config file is wrong is one line (a ConfigFileError naming the file).

The command line (trainer/cli/config_file.py: which file `--config` means) and the
Python API (trainer.run with a config's path) both load through here. A signal during
get_config() (trainer.errors.Preempted, a BaseException) passes through untouched.
"""
import os
import sys
import traceback
import types

import ml_collections

import configs

RECORDED = configs.path_of("recorded")


class ConfigFileError(Exception):
  """The config file cannot be loaded: exit 2, one line."""


def resolve(value: str) -> str:
  """A --config value as the file spec to load: NAME -> configs/NAME.py, X.json ->
  configs/recorded.py:X.json; a path to a .py file (with its :ARG) as it is."""
  file = value.split(":", 1)[0]
  if file.endswith(".json"):
    return f"{RECORDED}:{value}"
  if file.endswith(".py") or os.sep in file:
    return value
  if value not in configs.NAMES:
    raise ConfigFileError(
        f"unknown config {value!r} (choose from: {', '.join(configs.NAMES)}, or give a path "
        f"to a config .py file, or a model_dir's config.json)")
  return configs.path_of(value)


def load(spec: str) -> ml_collections.ConfigDict:
  """get_config() of FILE (or get_config(ARG) for FILE:ARG)."""
  file, has_argument, argument = spec.partition(":")
  if file == RECORDED:  # errors name the user's config.json, not configs/recorded.py
    return _call_get_config(_module(file, f"--config={file}"), (argument,),
                            f"--config={argument}", recorded=True)
  shown = f"--config={file}"
  return _call_get_config(_module(file, shown), (argument,) if has_argument else (), shown)


def _module(file: str, shown: str) -> types.ModuleType:
  if not os.path.exists(file):
    raise ConfigFileError(f"{shown}: no such file")
  if not os.path.isfile(file):
    raise ConfigFileError(f"{shown} is not a file (give a config .py file)")
  try:
    with open(file) as f:
      source = f.read()
  except (OSError, UnicodeDecodeError) as e:
    raise ConfigFileError(f"{shown} cannot be read ({getattr(e, 'strerror', None) or e})") \
        from None
  try:
    code = compile(source, file, "exec")
  except SyntaxError as e:
    raise ConfigFileError(f"{shown}: syntax error at line {e.lineno}: {e.msg} (a config file "
                          f"is Python defining get_config())") from None
  name = "distloop_config_" + os.path.splitext(os.path.basename(file))[0]
  module = types.ModuleType(name)
  module.__file__ = os.path.abspath(file)
  sys.modules[name] = module  # as an import would (a dataclass in it looks itself up)
  try:
    exec(code, module.__dict__)  # pylint: disable=exec-used
  except Exception as e:  # pylint: disable=broad-except  (any error of the user's code)
    raise ConfigFileError(f"{shown}: running it raised {_described_error(e, file)}") from None
  return module


def _call_get_config(module: types.ModuleType, arguments: tuple, shown: str,
                     recorded: bool = False) -> ml_collections.ConfigDict:
  get_config = getattr(module, "get_config", None)
  if not callable(get_config):
    raise ConfigFileError(f"{shown} defines no get_config() (a config file's get_config() "
                          f"returns an ml_collections.ConfigDict: see configs/synthetic.py)")
  try:
    config = get_config(*arguments)
  except Exception as e:  # pylint: disable=broad-except  (any error of the user's code)
    if recorded:
      raise ConfigFileError(f"{shown} {_first_line(e)}") from None
    raise ConfigFileError(f"{shown}: get_config() raised "
                          f"{_described_error(e, module.__file__)}") from None
  if not isinstance(config, ml_collections.ConfigDict):
    raise ConfigFileError(f"{shown}: get_config() returned {type(config).__name__}, not an "
                          f"ml_collections.ConfigDict")
  return config


def _described_error(error: Exception, file: str) -> str:
  """'ValueError: boom (line 3)': the error, and the last line of `file` it passed."""
  lines = [lineno for frame, lineno in traceback.walk_tb(error.__traceback__)
           if os.path.abspath(frame.f_code.co_filename) == os.path.abspath(file)]
  where = f" (line {lines[-1]})" if lines else ""
  return f"{type(error).__name__}: {_first_line(error)}{where}"


def _first_line(error: Exception) -> str:
  text = str(error).strip()
  return (text.splitlines()[0] if text else type(error).__name__)[:300]
