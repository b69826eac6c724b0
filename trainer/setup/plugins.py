"""Plug-ins by name: a built-in name, or `MODULE:FUNCTION` naming the user's own code.

MODULE is a dotted importable module (`my_project.models`) or a path to a `.py`
file (`/work/my_project/models.py`, or relative to the working directory). A file
is imported under its own name with its folder put on `sys.path`, so it may
import its siblings (none named like distloop's packages: module_names.py). Every failure is a `UserError` naming the config field and
the plug-in, so a typo is one line on stderr (exit 2), not a traceback.

`build_model` and `load_data` are where `model.name` and `data.name` become a
model and two sources: the built-ins come from the registries in models/ and
input_pipelines/ (which import nothing from trainer/), plug-ins from here.
"""
import functools
import importlib
import importlib.util
import os
import sys
from typing import Callable

import input_pipelines
from input_pipelines import padding
from input_pipelines.errors import DataError
import models
from trainer.errors import UserError  # re-exported for registries
from trainer.setup import module_names


# Plug-ins that run inside the traced step: AutoGraph converts them (autograph_scope).
_CALLED_IN_THE_STEP = ("train.loss", "eval.metrics", "data.preprocess")


def is_plugin(spec: str) -> bool:
  """`MODULE:FUNCTION` rather than a built-in name."""
  return ":" in spec


def resolve(field: str, spec: str, builtins: dict[str, Callable] | None = None) -> Callable:
  """The callable that `spec` (the value of config field `field`) names."""
  if not is_plugin(spec):
    if builtins is not None and spec in builtins:
      return builtins[spec]
    choices = ", ".join(builtins or ())
    raise UserError(f"{field}={spec!r} is unknown (choose from: {choices}, "
                    f"or MODULE:FUNCTION for your own)")
  module_name, _, function_name = spec.rpartition(":")
  if not module_name or not function_name.isidentifier():
    raise UserError(f"{field}={spec!r} is not MODULE:FUNCTION")
  module = _import(field, spec, module_name)
  function = getattr(module, function_name, None)
  if function is None:
    raise UserError(f"{field}={spec!r}: {module_name} has no {function_name!r}")
  if not callable(function):
    raise UserError(f"{field}={spec!r}: {function_name} is not callable")
  if field in _CALLED_IN_THE_STEP:
    from input_pipelines import autograph_scope  # pylint: disable=g-import-not-at-top  (TensorFlow)
    return autograph_scope.user_function(function)
  return function


def name_of(spec: str) -> str:
  """What a plug-in is reported as: FUNCTION of MODULE:FUNCTION, or the built-in name."""
  return spec.rpartition(":")[2]


def build_model(model_config, input_spec):
  """A new keras.Model from `model.name` (call inside `strategy.scope()` to distribute
  it); a built-in that cannot take the features, or any plug-in failure: one line."""
  import keras  # pylint: disable=g-import-not-at-top  (checking a config never imports Keras)
  name = model_config.name
  builder = resolve("model.name", name, models.BUILTINS)
  if name in models.BUILTINS:
    try:
      model = builder(model_config, input_spec)
    except models.ModelError as e:
      raise UserError(str(e)) from None
  else:
    model = call("model.name", name, builder, model_config, input_spec)
  if not isinstance(model, keras.Model):
    raise UserError(f"model.name={name!r} returned {type(model).__name__}, not a keras.Model")
  return model


def load_data(data_config, seed: int):
  """(train, eval) sources from `data.name`, checked (input_pipelines/sources.py); a
  built-in's bad files are a DataError, a plug-in's failure is one line naming it."""
  name = data_config.name
  build = resolve("data.name", name, input_pipelines.BUILTINS)
  splits = (build(data_config, seed) if name in input_pipelines.BUILTINS
            else call("data.name", name, build, data_config, seed))
  return input_pipelines.as_splits(splits, f"data.name={name!r}",
                                   padding.from_config(data_config))


def call(field: str, spec: str, function: Callable, *args):
  """Calls a user's function; anything it raises becomes one line naming the plug-in
  (a DataError, already one line naming the data, as it is)."""
  try:
    return function(*args)
  except (UserError, DataError):
    raise
  except SystemExit as e:  # would end the trainer with the plug-in's code, nothing trained
    raise UserError(exit_message(field, spec, e)) from None
  except Exception as e:  # pylint: disable=broad-except  (user code raises anything)
    raise UserError(f"{field}={spec!r} raised {type(e).__name__}: {_first_line(e)}") from None


def exit_message(field: str, spec: str, error: SystemExit, when: str = "") -> str:
  """The line for a plug-in that called sys.exit (or exit()) instead of returning."""
  return (f"{field}={spec!r} called sys.exit({error.code!r}){when}; a plug-in must return "
          f"its result or raise an exception, not end the process")


@functools.lru_cache(maxsize=None)
def _import(field: str, spec: str, module_name: str):
  is_file = module_name.endswith(".py") or os.sep in module_name
  try:
    if not is_file:
      return importlib.import_module(module_name)
    path = os.path.abspath(module_name)
    if not os.path.isfile(path):
      raise UserError(f"{field}={spec!r}: no such file {path}")
    stem = os.path.basename(path)
    stem = stem[:-len(".py")] if stem.endswith(".py") else stem
    try:
      module_names.put_on_path(path, f"{field}={spec!r}")
    except ValueError as e:
      raise UserError(str(e)) from None
    name = stem
    if name in sys.modules:  # imported already, or a name taken (e.g. a user's models.py)
      if getattr(sys.modules[name], "__file__", None) == path:
        return sys.modules[name]
      name = f"_distloop_plugin_{stem}"
    module_spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module
    module_spec.loader.exec_module(module)
    return module
  except UserError:
    raise
  except SystemExit as e:
    raise UserError(exit_message(field, spec, e, f" while {module_name} was imported")) from None
  except ModuleNotFoundError as e:
    raise UserError(f"{field}={spec!r}: cannot import {module_name} ({e})") from None
  except Exception as e:  # pylint: disable=broad-except  (importing user code runs it)
    raise UserError(f"{field}={spec!r}: importing {module_name} raised "
                    f"{type(e).__name__}: {_first_line(e)}") from None


def _first_line(error: Exception) -> str:
  return without_autograph(str(error), type(error).__name__)


def without_autograph(text: str, type_name: str) -> str:
  """The error's own first line: AutoGraph prefixes a converted function's error (a
  Task's step, a data.preprocess) with "in user code:" and the stack."""
  if "in user code:" in text:
    marker = f"{type_name}: "
    text = text[text.rindex(marker) + len(marker):] if marker in text else text
  text = text.strip()
  return (text.splitlines()[0] if text else type_name)[:300]
