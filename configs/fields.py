"""The configs `configs.get` returns: a misspelt field is one line, as on the command line.

ml_collections' locked ConfigDict refuses `config.train.stepz = 5` with a KeyError or
AttributeError that lists every field of the section and its values (27 for `train`),
on a second line the suggestion. The command line turns that into one line
(trainer/cli/main.py: `unknown config field --config.train.stepz (did you mean
'steps'?)`); from Python the error is raised by the assignment itself, before
trainer.run can translate anything, so the config has to say it: `Config` is a
ConfigDict whose every section knows its dotted path and raises `UnknownField`, the
same line without the flag's dashes. It is an ml_collections.ConfigDict in every other
way (equal to a plain one with the same fields, pickled, copied, locked as before).
"""
import difflib

import ml_collections

from trainer.errors import UserError

_PATH = "_distloop_path"  # where in the config a section is ("" for the root, "train", ...)
_OBJECT_ATTRIBUTES = frozenset(dir(object))


class UnknownField(UserError, AttributeError, KeyError):
  """A field the config does not have: one line naming it and the closest field. An
  AttributeError and a KeyError (what ml_collections raises for `.x` and `["x"]`, so
  `hasattr` and `in` callers are unaffected) and a UserError (trainer.run's bad input)."""

  def __str__(self):  # KeyError's would quote the line
    return str(self.args[0])


class Config(ml_collections.ConfigDict):
  """A ConfigDict whose unknown field, set or read, raises UnknownField in one line."""

  def __setattr__(self, attribute, value):
    self._check_known(attribute)
    super().__setattr__(attribute, value)

  def __getattr__(self, attribute):
    if attribute.startswith("_"):  # ConfigDict's own state, copy and pickle protocols
      return super().__getattr__(attribute)
    self._check_known(attribute, reading=True)
    return super().__getattr__(attribute)

  def __setitem__(self, key, value):
    self._check_known(key)
    if isinstance(value, ml_collections.ConfigDict):  # type-safe: a section stays a Config
      with_one_line_errors(value, self._child_path(key))
    super().__setitem__(key, value)
    stored = self._fields.get(key)  # a dict is converted to a (plain) ConfigDict
    if isinstance(stored, ml_collections.ConfigDict):
      with_one_line_errors(stored, self._child_path(key))

  def __getitem__(self, key):
    self._check_known(key, reading=True)
    return super().__getitem__(key)

  def __eq__(self, other):
    """Equal to a plain ConfigDict of the same fields (ConfigDict's own test asks for the
    same class, so `Config == ConfigDict` would be False one way round and not the other)."""
    if not isinstance(other, ml_collections.ConfigDict) or isinstance(
        other, ml_collections.FrozenConfigDict):
      return False
    return (self._fields == other._fields  # pylint: disable=protected-access
            and self.is_locked == other.is_locked and self.is_type_safe == other.is_type_safe)

  __hash__ = None  # as ConfigDict's

  def copy_and_resolve_references(self, visit_map=None):
    return with_one_line_errors(super().copy_and_resolve_references(visit_map),
                                self.__dict__.get(_PATH, ""))

  def __setstate__(self, state):
    object.__setattr__(self, _PATH, state.get(_PATH, ""))  # first: the fields are set next
    super().__setstate__(state)

  def _child_path(self, key) -> str:
    path = self.__dict__.get(_PATH, "")
    return f"{path}.{key}" if path else str(key)

  def _check_known(self, key, reading: bool = False) -> None:
    """UnknownField if `key` is no field of this section: always when reading (a field
    that does not exist), only when locked when setting (unlocked: a new field)."""
    fields = self.__dict__.get("_fields")  # None while a copy or an unpickling builds it
    if fields is None or not isinstance(key, str) or "." in key or key in fields:
      return  # ConfigDict's own handling: dotted keys (a.b) recurse into sections
    if not reading and not self.is_locked:
      return
    if key in _OBJECT_ATTRIBUTES:  # ConfigDict's own line: "__class__ cannot be overridden"
      return
    close = difflib.get_close_matches(key, [str(name) for name in fields], 1, 0.75)
    hint = f"did you mean {close[0]!r}?" if close else "configs/common.py lists every field"
    raise UnknownField(f"unknown config field {self._child_path(key)} ({hint})")


def with_one_line_errors(config: ml_collections.ConfigDict, path: str = "", _seen=None):
  """`config` and each of its sections made a `Config` in place (the same objects, so
  FieldReferences between fields hold), each knowing its dotted path; returns it."""
  seen = set() if _seen is None else _seen
  if isinstance(config, ml_collections.FrozenConfigDict) or id(config) in seen:
    return config  # frozen: nothing to set; seen: a section that refers back to itself
  seen.add(id(config))
  if type(config) is ml_collections.ConfigDict:  # pylint: disable=unidiomatic-typecheck
    object.__setattr__(config, "__class__", Config)
  if isinstance(config, Config):
    object.__setattr__(config, _PATH, path)
  for key, value in config._fields.items():  # pylint: disable=protected-access  (no resolving)
    if isinstance(value, ml_collections.ConfigDict):
      with_one_line_errors(value, f"{path}.{key}" if path else str(key), seen)
  return config
