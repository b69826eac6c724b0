"""Checkpoint keys for everything a Task builds, the same in every process.

Keras names what it is not told to name by counting per process: the second
model built in a notebook is `functional_1`, its layers `dense_4`, ..., and
Keras's own variable paths (and its optimizers' slot names) carry those numbers.
A checkpoint keyed by them could not be restored by a second run in the same
process. Here a name Keras chose (its class in snake case, maybe `_<n>`) is
replaced by the one a fresh process building only this task would give it: the
base name, numbered by order of appearance in the task's state. Names a user
chose are kept. What is not a model is keyed by where the task holds it (`<name>`:
the attribute, `<attribute>_<key or index>` in a dict or list; trainer/state/task_state.py).
Keys:

    model item:      <model>/<layer>[/<sublayer>...]/<variable>   every model
                     state/<name>[/<sublayer>...]/<variable>      a layer or metric held
                                                                  outside the models
                     state/<name>                                 extra variables, a random
                                                                  generator's state
    optimizer item:  <optimizer>/iteration, <optimizer>/<variable key with _>_<slot>
                     loss_scale/<optimizer>/scale|finite_steps    (float16)
"""
import collections
import re

import keras
import tensorflow as tf

from trainer.errors import UserError


def _snake(name: str) -> str:
  return keras.src.utils.naming.to_snake_case(name)  # Keras's own rule for auto names


class _Namer:
  """Stable names: an automatic `<base>[_<n>]` becomes `<base>`, `<base>_1`, ... in order."""

  def __init__(self):
    self._seen = collections.Counter()

  def __call__(self, obj) -> str:
    name = obj.name
    base = _snake(type(obj).__name__)
    if re.fullmatch(rf"{re.escape(base)}(_\d+)?", name):
      count = self._seen[base]
      self._seen[base] += 1
      return base if count == 0 else f"{base}_{count}"
    return name


def _children(layer) -> list:
  return list(layer._flatten_layers(include_self=False, recursive=False))  # pylint: disable=protected-access


def model_variables(models: dict) -> dict:
  """{stable key: variable} of every model in `models` ({stable model name: model}).

  A variable belongs to the deepest layer holding it (a Dropout's seed state to
  the Dropout), so a nested model's variables keep their own layer names.
  """
  keyed, owner, seen = {}, {}, set()
  namer = _Namer()

  def walk(layer, prefix: str) -> None:
    for variable in layer.variables:
      owner[id(variable)] = prefix
    for child in _children(layer):
      walk(child, f"{prefix}/{namer(child)}")

  for name, model in models.items():
    owner.clear()
    walk(model, name)
    for variable in model.variables:
      if id(variable) in seen:  # shared with a model before this one: keyed there
        continue
      seen.add(id(variable))
      key = f"{owner.get(id(variable), name)}/{variable.name}"
      if key in keyed:
        raise UserError(f"two variables of the task share the checkpoint key {key!r}; give "
                        f"their layers distinct names")
      keyed[key] = variable
  return keyed


def model_names(models: list, what: str = "models") -> dict:
  """{stable name: model} for the task's models (or optimizers), in order."""
  namer = _Namer()
  named = {}
  for model in models:
    name = namer(model)
    if name in named:
      raise UserError(f"two {what} of the task are both named {name!r}; name them apart")
    named[name] = model
  return named


def optimizer_names(optimizers: list) -> dict:
  """{stable name: optimizer}, as model_names."""
  return model_names(optimizers, "optimizers")


def optimizer_variables(optimizers: dict, model_keys: dict) -> dict:
  """{stable key: variable} of every optimizer's state; `model_keys` is model_variables().

  The learning rate is left out: it comes from the config (a resume may change it).
  A slot is named after its variable's stable key (Keras names it after the path).
  """
  by_path = {variable.path.replace("/", "_"): key.replace("/", "_")
             for key, variable in model_keys.items()}
  keyed = {}
  for name, optimizer in optimizers.items():
    slot_of = _slots_by_variable(optimizer)
    own = {id(value): attribute.strip("_") for attribute, value in vars(optimizer).items()
           if is_variable(value)}
    for variable in optimizer.variables:
      leaf = variable.name
      if leaf == "learning_rate":
        continue
      reference = max((path for path in by_path if leaf.startswith(path + "_")),
                      key=len, default=None)
      if reference is not None:
        leaf = by_path[reference] + leaf[len(reference):]
      elif id(variable) in slot_of:  # a slot named without its variable (Adafactor's r, c)
        model_variable, kind = slot_of[id(variable)]
        path = model_variable.path.replace("/", "_")
        leaf = f"{by_path.get(path, path)}_{kind}"
      elif id(variable) in own and re.fullmatch(r"variable(_\d+)?", leaf):
        leaf = own[id(variable)]  # Keras's automatic name (Nadam's product): its attribute
      key = f"{name}/{leaf}"
      if key in keyed:
        raise UserError(f"two variables of optimizer {name!r} share the checkpoint key {key!r}")
      keyed[key] = variable
  return keyed


def _slots_by_variable(optimizer) -> dict:
  """{id(slot): (its model variable, the slot list's name)}: Keras optimizers keep each kind
  of slot in a list parallel to the variables they update (`_momentums`, Adafactor's `_r`)."""
  updated = list(getattr(optimizer, "_trainable_variables", None) or [])
  found = {}
  for attribute, value in sorted(vars(optimizer).items()):
    if (attribute != "_trainable_variables" and isinstance(value, (list, tuple)) and updated
        and len(value) == len(updated) and all(is_variable(slot) for slot in value)):
      for slot, model_variable in zip(value, updated):
        found.setdefault(id(slot), (model_variable, attribute.strip("_")))
  return found


def layer_variables(layers: dict, keyed: dict) -> dict:
  """{state/<name>/[<sublayer>/...]<variable>: variable} of the layers and metrics a task
  holds outside its models ({name: layer or metric}); a variable `keyed` has already (a
  layer of a model) stays keyed there."""
  taken = {id(variable) for variable in keyed.values()}
  found = {}
  for name, layer in layers.items():
    if isinstance(layer, keras.metrics.Metric):
      own = {f"state/{name}/{variable.name}": variable for variable in layer.variables}
    else:
      own = model_variables({f"state/{name}": layer})
    for key, variable in own.items():
      if id(variable) not in taken:
        taken.add(id(variable))
        found[key] = variable
  return found


def extra_variables(variables: dict) -> dict:
  """{state/<name>: variable} of the task's own variables (counters, EMA weights)."""
  return {f"state/{name}": variable for name, variable in variables.items()}


def merged(*keyed: dict) -> dict:
  """One {key: variable} of several; a key given twice, or one that is another's folder
  (`state/a` and `state/a/kernel`), would overwrite the other in the checkpoint: refused."""
  result = {}
  for part in keyed:
    for key, variable in part.items():
      if key in result:
        raise UserError(f"two variables of the task share the checkpoint key {key!r}; "
                        f"name them apart")
      result[key] = variable
  folders = {"/".join(key.split("/")[:i]) for key in result for i in range(1, key.count("/") + 1)}
  clash = sorted(folders.intersection(result))
  if clash:
    raise UserError(f"the checkpoint key {clash[0]!r} of a variable of the task is also a "
                    f"folder of other keys; name them apart")
  return result


def as_saved(model_variables: dict, optimizer_variables: dict) -> dict:
  """{'model/<key>' | 'optimizer/<key>': variable}: the keys a checkpoint step holds its
  items' variables under (the restore's check, verify's digests)."""
  return {f"{item}/{key}": variable for item, variables in
          (("model", model_variables), ("optimizer", optimizer_variables))
          for key, variable in variables.items()}


def is_variable(value) -> bool:
  return isinstance(value, (tf.Variable, keras.Variable))
