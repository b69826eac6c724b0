"""`--config`: which file is loaded, and one line for each way a config file is wrong.

Who owns what: trainer/cli/main.py owns the flags; this module owns the value of
`--config` (`choose`) and its parser (`Parser`, in place of ml_collections' own,
whose failures are tracebacks or name a module `config_config`); configs/files.py
loads the file.

  --config=NAME             configs/NAME.py
  --config=PATH.py[:ARG]    that file (get_config(ARG) if ARG is given)
  --config=DIR/config.json  the config a run recorded there (configs/recorded.py)
  no --config               model_dir/config.json if model_dir holds one (any mode:
                            eval, export, continuous_eval, predict and a resume run the
                            model trained there); else `synthetic` for train and
                            train_and_eval, and a refusal for the modes that read
                            a model_dir (nothing there to read)

A file that does not exist, does not compile, raises, has no get_config() or
returns something other than a ConfigDict is a ConfigFileError: one line naming
the file and what is wrong (exit 2), before anything is written.
"""
import os
import shlex
import sys

from absl import flags

import configs
from configs.files import RECORDED as _RECORDED
from configs.files import resolve
from configs.files import ConfigFileError
from configs.files import load
from input_pipelines.native_output import native_startup_silenced
from trainer.store import mirror
from trainer.store import model_dir as layout
from trainer.setup import module_names
from trainer.errors import UserError

READING_MODES = ("eval", "export", "continuous_eval", "predict")
_DEFAULT = "synthetic"


def choose(argv: list[str]) -> tuple[list[str], str]:
  """`argv` with `--config` resolved to a file (inserted when absent), and a few words
  saying which config that is (logged at start-up)."""
  resolved = list(argv)
  _stage_model_dir(resolved)
  index, value = _flag_value(resolved, "config")
  if value is not None:
    spec = resolve(value)
    if index + 1 < len(resolved) and resolved[index] in ("--config", "-config"):
      resolved[index + 1] = spec
    else:
      resolved[index] = "--config=" + spec
    return resolved, _described(spec, argv)
  model_dir = _flag_value(resolved, "model_dir")[1]
  mode = _flag_value(resolved, "mode")[1] or "train"
  recorded = layout.config_path(model_dir) if model_dir else None
  if recorded and os.path.isfile(recorded):
    spec = f"{_RECORDED}:{recorded}"
  elif mode in READING_MODES and recorded:  # no --model_dir at all: absl says so
    raise ConfigFileError(
        f"--mode={mode}: no {recorded} to read the model's config from "
        f"(nothing trained there yet?); pass the training run's --config and overrides")
  else:
    spec = configs.path_of(_DEFAULT)
  return [resolved[0], "--config=" + spec, *resolved[1:]], _described(spec, argv)


def _stage_model_dir(argv: list[str]) -> None:
  """A gs:// or s3:// --model_dir becomes its local staging directory in `argv`
  (trainer/store/mirror.py), before its config.json is looked for there; UserError
  (as a ConfigFileError: exit 2) for a URL that cannot be used."""
  index, model_dir = _flag_value(argv, "model_dir")
  if not model_dir:
    return
  try:
    staged = mirror.staged(model_dir)
  except UserError as e:
    raise ConfigFileError(str(e)) from None
  if staged != model_dir:
    if argv[index].startswith(("--model_dir=", "-model_dir=")):
      argv[index] = "--model_dir=" + staged
    else:
      argv[index + 1] = staged


def command(argv: list[str], resolved: list[str]) -> str:
  """This run's command, shell-quoted so that it can be pasted to run it again (the run
  summary's `config` line): `python -m trainer`, `--config` as typed (or the one chosen
  when none was: the model_dir's config.json, synthetic), then every other flag as typed,
  each `--config.FIELD=VALUE` override included."""
  typed = _flag_value(argv, "config")[1]
  if typed is None:
    file, _, argument = _flag_value(resolved, "config")[1].partition(":")
    name = os.path.splitext(os.path.basename(file))[0]
    typed = (argument if file == _RECORDED
             else name if file == configs.path_of(name)
             else f"{file}:{argument}" if argument else file)
  others, skip_value = [], False
  for arg in argv[1:]:
    if skip_value:
      skip_value = False
    elif arg in ("--config", "-config"):
      skip_value = True
    elif not arg.startswith(("--config=", "-config=")):
      others.append(arg)
  return shlex.join(["python", "-m", "trainer", f"--config={typed}", *others])


def _described(spec: str, argv: list[str]) -> str:
  """The config in words, as the log says it: the file, then the `--config.FIELD=VALUE`
  overrides applied on top of it (a recorded config with `--config.runtime.*` given is
  not the config recorded)."""
  file, _, argument = spec.partition(":")
  name = os.path.splitext(os.path.basename(file))[0]
  words = (f"the config recorded in {argument}" if file == _RECORDED
           else f"--config={name}" if file == configs.path_of(name) else f"--config={spec}")
  overrides = _overrides(argv)
  return f"{words} and {shlex.join(overrides)}" if overrides else words


def _overrides(argv: list[str]) -> list[str]:
  """The `--config.FIELD=VALUE` (or `--config.FIELD VALUE`) flags of argv, as typed."""
  found = []
  for i, arg in enumerate(argv[1:], start=1):
    if arg.startswith(("--config.", "-config.")):
      alone = "=" in arg or i + 1 >= len(argv) or argv[i + 1].startswith("--")
      found.append(arg if alone else f"{arg}={argv[i + 1]}")
  return found


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
    # A config file that imports TensorFlow (examples/gan.py) would print TensorFlow's C++
    # start-up lines before any refusal: hidden, as for plug-ins (Python errors still show).
    if not any(arg.startswith(("--verbosity", "-v")) for arg in sys.argv[1:]):
      os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # read when TensorFlow is imported
    try:
      module_names.put_config_folder_on_path(argument)
    except ValueError as e:
      raise ConfigFileError(str(e)) from None
    with native_startup_silenced():
      config = load(argument)
    if self._lock_config:
      config.lock()
    return config

  def flag_type(self):
    return "config object"
