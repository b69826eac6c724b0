"""Which fields of a Task's own config sections fix the run (`Task.run_fixing_fields`).

A section a user's config adds (`gan`, `distill`) is fixed on resume as a whole by
default (trainer/state/config_changes.py): distloop cannot know which of its fields
change what the run is (a latent size) and which only how it goes on (a learning
rate). A Task may say: `run_fixing_fields = {"gan": ("latent_dim",)}` fixes
gan.latent_dim and lets gan's other fields change on resume. Only added sections
may be declared (distloop's own sections keep distloop's rules), and each named
field must exist: a typo would free the field it meant. Pure Python.
"""
from trainer.errors import UserError

BUILT_IN_SECTIONS = ("model", "data", "train", "eval", "checkpoint", "runtime")


def declared(task) -> dict | None:
  """`{section: (field, ...)}` a Task instance or class declares; None if it declares none."""
  owner = task if isinstance(task, type) else type(task)
  return getattr(owner, "run_fixing_fields", None)


def checked(declaration, config_dict: dict, task_name: str) -> dict | None:
  """The declaration as {section: tuple of fields}, UserError (one line) if it is not
  one of sections this config adds and fields they hold."""
  if declaration is None:
    return None
  where = f"{task_name}.run_fixing_fields"
  if not isinstance(declaration, dict):
    raise UserError(f"{where} is {type(declaration).__name__}, not a dict of {{section: "
                    f"(field, ...)}}, e.g. {{'gan': ('latent_dim',)}}")
  result = {}
  for section, fields in declaration.items():
    if section in BUILT_IN_SECTIONS:
      raise UserError(f"{where} names {section!r}: distloop's own section keeps its own "
                      f"rules on resume; declare only the sections your config adds")
    if not isinstance(config_dict.get(section), dict):
      raise UserError(f"{where} names section {section!r}, which this config does not have")
    if isinstance(fields, str) or not all(isinstance(field, str) for field in fields):
      raise UserError(f"{where}[{section!r}] is {fields!r}, not a tuple of field names")
    flat = _flat(config_dict[section])
    for field in fields:
      if not any(name == field or name.startswith(field + ".") for name in flat):
        raise UserError(f"{where} names {section}.{field}, which this config does not have")
    result[section] = tuple(fields)
  return result


def may_change(task, config_dict: dict):
  """For trainer/state/config_changes.py: a predicate `field -> bool` (a field of a Task's
  section that does not fix the run) or None (the Task declares nothing); UserError if
  the declaration is wrong."""
  owner = task if isinstance(task, type) else type(task)
  declaration = checked(declared(task), config_dict, owner.__name__)
  if declaration is None:
    return None
  return lambda field: is_free(field, declaration)


def is_free(field: str, declaration: dict | None) -> bool:
  """Whether a Task's declaration lets `field` ('gan.learning_rate') change on resume."""
  if not declaration:
    return False
  section, _, rest = field.partition(".")
  if section not in declaration:
    return False
  return not any(rest == fixing or rest.startswith(fixing + ".")
                 for fixing in declaration[section])


def _flat(tree: dict, prefix: str = "") -> list:
  names = []
  for key, value in tree.items():
    names.extend(_flat(value, f"{prefix}{key}.") if isinstance(value, dict)
                 else [prefix + key])
  return names
