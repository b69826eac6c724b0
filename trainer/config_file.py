"""`--config`: which file is loaded, and one line for each way a config file is wrong.

Who owns what: trainer/__main__.py owns the flags; this module owns the value of
`--config` (`choose`) and loading it (`Parser`, in place of ml_collections' own,
whose failures are tracebacks or name a module `config_config`).

  --config=NAME             configs/NAME.py
  --config=PATH.py[:ARG]    that file (get_config(ARG) if ARG is given)
  --config=DIR/config.json  the config a run recorded there (configs/recorded.py)
  no --config               model_dir/config.json if model_dir holds one (any mode:
                            eval, export, continuous_eval and a resume run the
                            model trained there); else `synthetic` for train and
                            train_and_eval, and a refusal for the modes that read
                            a model_dir (nothing there to read)

A file that does not exist, does not compile, raises, has no get_config() or
returns something other than a ConfigDict is a ConfigFileError: one line naming
the file and what is wrong (exit 2), before anything is written.
"""
import os
import sys
import traceback
import types

from absl import flags
import ml_collections

import configs
from trainer.errors import Preempted

READING_MODES = ("eval", "export", "continuous_eval")
_RECORDED = configs.path_of("recorded")
_DEFAULT = "synthetic"


class ConfigFileError(Exception):
  """The config file cannot be loaded: exit 2, one line."""


def choose(argv: list[str]) -> tuple[list[str], str]:
  """`argv` with `--config` resolved to a file (inserted when absent), and a few words
  saying which config that is (logged at start-up)."""
  resolved = list(argv)
  index, value = _flag_value(resolved, "config")
  if value is not None:
    spec = resolve(value)
    if index + 1 < len(resolved) and resolved[index] in ("--config", "-config"):
      resolved[index + 1] = spec
    else:
      resolved[index] = "--config=" + spec
    return resolved, _described(spec)
  model_dir = _flag_value(resolved, "model_dir")[1]
  mode = _flag_value(resolved, "mode")[1] or "train"
  recorded = os.path.join(model_dir, "config.json") if model_dir else None
  if recorded and os.path.isfile(recorded):
    spec = f"{_RECORDED}:{recorded}"
  elif mode in READING_MODES and recorded:  # no --model_dir at all: absl says so
    raise ConfigFileError(
        f"--mode={mode}: no {recorded} to read the model's config from "
        f"(nothing trained there yet?); pass the training run's --config and overrides")
  else:
    spec = configs.path_of(_DEFAULT)
  return [resolved[0], "--config=" + spec, *resolved[1:]], _described(spec)


def resolve(value: str) -> str:
  """A --config value as the file spec to load: NAME -> configs/NAME.py, X.json ->
  configs/recorded.py:X.json; a path to a .py file (with its :ARG) as it is."""
  file = value.split(":", 1)[0]
  if file.endswith(".json"):
    return f"{_RECORDED}:{value}"
  if file.endswith(".py") or os.sep in file:
    return value
  if value not in configs.NAMES:
    raise ConfigFileError(
        f"unknown config {value!r} (choose from: {', '.join(configs.NAMES)}, or give a path "
        f"to a config .py file, or a model_dir's config.json)")
  return configs.path_of(value)


def _described(spec: str) -> str:
  file, _, argument = spec.partition(":")
  if file == _RECORDED:
    return f"the config recorded in {argument}"
  name = os.path.splitext(os.path.basename(file))[0]
  return f"--config={name}" if file == configs.path_of(name) else f"--config={spec}"


def _flag_value(argv: list[str], name: str) -> tuple[int, str | None]:
  """(index, value) of the last `--name=V` / `--name V` in argv; (-1, None) if absent."""
  found = (-1, None)
  for i, arg in enumerate(argv[1:], start=1):
    for prefix in (f"--{name}", f"-{name}"):
      if arg.startswith(prefix + "="):
        found = (i, arg[len(prefix) + 1:])
      elif arg == prefix and i + 1 < len(argv):
        found = (i, argv[i + 1])
  return found


class Parser(flags.ArgumentParser):
  """The parser of `--config` (in place of ml_collections' own): a ConfigFileError for a
  bad file. ml_collections' flag applies the `--config.FIELD=VALUE` overrides on top."""

  def __init__(self, lock_config: bool = True):
    self._lock_config = lock_config

  def parse(self, argument):
    config = load(argument)
    if self._lock_config:
      config.lock()
    return config

  def flag_type(self):
    return "config object"


def load(spec: str) -> ml_collections.ConfigDict:
  """get_config() of FILE (or get_config(ARG) for FILE:ARG)."""
  file, has_argument, argument = spec.partition(":")
  if file == _RECORDED:  # errors name the user's config.json, not configs/recorded.py
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
  except Preempted:
    raise
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
  except Preempted:
    raise
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
