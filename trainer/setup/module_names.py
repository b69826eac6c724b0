"""distloop's top-level package names against a user's own modules of the same name.

distloop installs the top-level packages trainer, models, configs and
input_pipelines. Python has one module per name in a process, so a user's
`models.py` either shadows distloop's package (found first on `sys.path`: the
working directory of `python -m trainer`, a script's folder) or is shadowed by it
(an `import models` in a config file or plug-in gets distloop's, imported already).
Both are refused in one line naming the two, before anything is written: a rename
fixes it, a silent mix-up would fail somewhere far away, or not at all.

The folder of a config file or a plug-in file goes on `sys.path` (so it may import
its own siblings), once checked here. Imports only the standard library: the check
runs before distloop's own packages are imported.
"""
import importlib.util
import os
import sys

PACKAGES = ("trainer", "models", "configs", "input_pipelines")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_FIX = f"rename your file (distloop's top-level packages are {', '.join(PACKAGES)})"


def shadowing() -> str | None:
  """The line saying which module shadows one of distloop's packages, or None."""
  for name in PACKAGES:
    found = _found_file(name)
    own = os.path.join(ROOT, name, "__init__.py")
    if found is not None and not _same_file(found, own):
      shown = os.path.dirname(found) if found.endswith("__init__.py") else found
      return (f"{shown} shadows distloop's package {name} ({os.path.dirname(own)}), as it "
              f"comes first on sys.path (the working directory, or a script's folder): "
              f"{_FIX}")
  return None


def put_on_path(file: str, shown: str) -> None:
  """Puts the folder of `file` (a user's config or plug-in file, named `shown` in the
  error) on `sys.path`: ValueError if a module there is named like a distloop package
  (other than `file` itself, which is loaded under a name of its own)."""
  folder = os.path.dirname(os.path.abspath(file))
  if _same_file(folder, ROOT) or (_same_file(os.path.dirname(folder), ROOT)
                                  and os.path.basename(folder) in PACKAGES):
    return  # distloop's own (configs/: a built-in config), importable as it is
  for name in PACKAGES:
    for clash in (os.path.join(folder, name + ".py"), os.path.join(folder, name, "__init__.py")):
      if os.path.isfile(clash) and not _same_file(clash, file):
        clash = os.path.dirname(clash) if clash.endswith("__init__.py") else clash
        raise ValueError(
            f"{clash}, beside {shown}, has the name of distloop's package {name}: an "
            f"`import {name}` there would get distloop's ({os.path.join(ROOT, name)}): {_FIX}")
  if folder not in sys.path:
    sys.path.insert(0, folder)


def put_config_folder_on_path(spec: str) -> None:
  """put_on_path for a config file's spec (FILE[:ARG]); a built-in config (configs/) and a
  recorded config.json (read by configs/recorded.py) leave sys.path as it is."""
  file = spec.partition(":")[0]
  if os.path.isfile(file):
    put_on_path(file, f"--config={file}")


def _found_file(name: str) -> str | None:
  module = sys.modules.get(name)
  if module is not None:
    return getattr(module, "__file__", None)
  try:
    spec = importlib.util.find_spec(name)
  except (ImportError, ValueError):
    return None
  return spec.origin if spec is not None and spec.has_location else None


def _same_file(a: str, b: str) -> bool:
  return os.path.realpath(a) == os.path.realpath(b)
