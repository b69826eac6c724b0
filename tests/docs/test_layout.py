"""The arrows of the layout point one way: trainer/ uses input_pipelines/ and models/,
never the reverse (docs/layout.md), so the data and model registries can be read, reused
and tested without the loop; inside trainer/ each place imports only the places below it."""
import ast
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]


def _imported_modules(path: pathlib.Path) -> set[str]:
  names = set()
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.Import):
      names.update(alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
      names.add(node.module)
  return names


@pytest.mark.parametrize("package", ["input_pipelines", "models"])
def test_lower_packages_import_nothing_from_trainer(package):
  upward = {str(path.relative_to(REPO)): sorted(name for name in _imported_modules(path)
                                                 if name.split(".")[0] == "trainer")
            for path in sorted((REPO / package).rglob("*.py"))}
  assert not {path: names for path, names in upward.items() if names}


# input_pipelines/ grouped by job: the records format and its converter over the built-in
# datasets (the converter reads their formats), both over the core stream at the top.
_PIPELINE_GROUPS = ("records", "datasets", "core")


def _pipeline_group(module: str) -> str | None:
  parts = module.split(".")
  if parts[0] != "input_pipelines":
    return None
  return parts[1] if len(parts) > 1 and parts[1] in _PIPELINE_GROUPS else "core"


def test_imports_inside_input_pipelines_point_one_way():
  """The core imports neither datasets/ nor records/ (the registry names its builders as
  strings, imported on first use), datasets/ nothing from records/; input_pipelines/convert.py
  only keeps the documented command, `python -m input_pipelines.convert`."""
  upward = []
  for path in sorted((REPO / "input_pipelines").rglob("*.py")):
    relative = path.relative_to(REPO)
    if relative.as_posix() == "input_pipelines/convert.py":
      continue
    own = _pipeline_group(".".join(relative.with_suffix("").parts))
    for name in _imported_modules(path):
      group = _pipeline_group(name)
      if group is not None and _PIPELINE_GROUPS.index(group) < _PIPELINE_GROUPS.index(own):
        upward.append(f"{relative} imports {name}")
  assert not upward


# trainer/'s top level: the public API, the two commands and Ray Train's entry; everything
# else in one of thirteen places, named for its job (docs/layout.md).
_TOP_LEVEL = {"__init__.py", "__main__.py", "api.py", "errors.py", "launch.py", "ray_train.py"}
_PLACES = ("cli", "verify", "inspect", "sweeps", "loop", "reporters", "supervised", "state", "analysis", "task",
           "setup", "cluster", "store")
# Who may import whom inside trainer/: a place imports only the places after it in this
# order (and itself); errors.py is everyone's. trainer/api.py stands over loop/ and
# under cli/. The supervised Task is one Task among others: over the contract (task/) and
# what is saved (state/); what a Task holds is keyed in state/, over the contract it walks.
# verify/ and inspect/ are commands that look at a job from outside, over everything;
# sweeps/ runs trials through the api for a tuner.
_LAYERS = ("cli", "verify", "inspect", "sweeps", "api", "loop", "reporters", "supervised", "state", "analysis",
           "task", "setup", "cluster", "store", "errors")


def test_trainer_top_level_holds_only_the_api_and_its_places():
  entries = {path.name for path in (REPO / "trainer").iterdir()
             if path.name != "__pycache__"}
  assert entries == _TOP_LEVEL | set(_PLACES)
  for place in _PLACES:
    init = REPO / "trainer" / place / "__init__.py"
    assert init.is_file(), init
    assert ast.get_docstring(ast.parse(init.read_text())), f"{init} says what lives there"


def _layer(module: str) -> str | None:
  parts = module.split(".")
  if parts[0] != "trainer" or len(parts) < 2:
    return None
  return parts[1] if parts[1] in _LAYERS else None


def test_imports_inside_trainer_point_one_way():
  upward = []
  for path in sorted((REPO / "trainer").rglob("*.py")):
    relative = path.relative_to(REPO / "trainer")
    own = relative.parts[0] if len(relative.parts) > 1 else relative.stem
    if own not in _LAYERS:
      continue  # __init__, __main__, launch, ray_train: the entry points over everything
    for name in _imported_modules(path):
      layer = _layer(name)
      if layer is not None and _LAYERS.index(layer) < _LAYERS.index(own):
        upward.append(f"trainer/{relative} imports {name}")
  assert not upward


def test_built_in_names_are_listed_once():
  """The start-up checks read trainer/setup/names.py; the registries answer exactly those
  names (a name added to one and not the other would pass the checks and fail later, or
  the reverse)."""
  import ml_collections  # pylint: disable=g-import-not-at-top
  from trainer.supervised import losses, metrics  # pylint: disable=g-import-not-at-top
  from trainer.setup import names  # pylint: disable=g-import-not-at-top
  from trainer.task import optimizers  # pylint: disable=g-import-not-at-top

  assert tuple(losses.BUILTINS) == names.LOSSES
  eval_config = ml_collections.ConfigDict({"metrics": ",".join(names.METRICS), "top_k": 2})
  assert tuple(metrics.resolve(eval_config, "mean_squared_error")) == names.METRICS
  from configs import common  # pylint: disable=g-import-not-at-top
  train = common.base_config().train
  assert tuple(optimizers._CLASSES) == names.OPTIMIZERS  # pylint: disable=protected-access
  for name in names.OPTIMIZERS:
    train.optimizer = name
    optimizers.create(train)
  for schedule in names.LR_SCHEDULES:
    train.lr_schedule = schedule
    optimizers.learning_rate(train)
  train.optimizer, train.lr_schedule = "sgd", "linear"
  with pytest.raises(ValueError):
    optimizers.learning_rate(train)


def test_the_task_folder_holds_only_what_a_step_author_uses():
  """trainer/task/ is the page a step author reads: the contract, what a step is handed
  and what it calls; internals live where their job is (state/, setup/, supervised/)."""
  modules = sorted(path.stem for path in (REPO / "trainer" / "task").glob("*.py"))
  assert len(modules) <= 8, modules
  assert set(modules) == {"__init__", "contract", "contexts", "optimizers", "loss_scale",
                          "sparse_gradients", "randomness", "user_code"}, modules


def test_the_supervised_task_is_built_on_the_public_contract_only():
  """The built-in step imports from trainer/task/ only what a user's Task may: the
  contract (Task, Export) and the contexts it is handed; never a private helper."""
  public = {"trainer.task", "trainer.task.contract", "trainer.task.contexts"}
  private = {f"trainer/supervised/{path.name}": sorted(
                 name for name in _imported_modules(path)
                 if name.startswith("trainer.task") and name not in public)
             for path in sorted((REPO / "trainer" / "supervised").glob("*.py"))}
  assert not {path: names for path, names in private.items() if names}


def test_start_up_checks_and_plug_in_loading_import_no_tensorflow():
  """trainer/setup/ runs before TensorFlow loads (a bad field fails in a fraction of a
  second, docs/performance.md): importing every module of it loads no TensorFlow."""
  modules = sorted(f"trainer.setup.{path.stem}" for path in (REPO / "trainer" / "setup").glob("*.py")
                   if path.stem != "__init__")
  code = (f"import sys\nimport {', '.join(modules)}\n"
          "loaded = sorted(m for m in ('tensorflow', 'keras', 'jax') if m in sys.modules)\n"
          "print(loaded)\nsys.exit(1 if loaded else 0)")
  result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
  assert result.returncode == 0, result.stdout + result.stderr[-2000:]


def test_no_module_of_trainer_is_over_450_lines():
  """A module a reader takes in at one sitting: one job each (docs/layout.md)."""
  long = {str(path.relative_to(REPO)): count for path in sorted((REPO / "trainer").rglob("*.py"))
          if (count := len(path.read_text().splitlines())) > 450}
  assert not long



def _attributes_set_outside_init(cls: ast.ClassDef) -> list[str]:
  """`self.NAME = ...` (or +=, or in a tuple) in a method of `cls` other than __init__."""
  found = []
  for method in cls.body:
    if not isinstance(method, ast.FunctionDef) or method.name == "__init__":
      continue
    for node in ast.walk(method):
      targets = (node.targets if isinstance(node, ast.Assign) else
                 [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else [])
      for target in targets:
        for item in target.elts if isinstance(target, ast.Tuple) else [target]:
          if (isinstance(item, ast.Attribute) and isinstance(item.value, ast.Name)
              and item.value.id == "self"):
            found.append(f"{method.name}: self.{item.attr} (line {node.lineno})")
  return found


def test_the_training_flow_reads_top_to_bottom():
  """Issue 58: Trainer.train reads like orbit's (at most 40 lines, the end of a run a
  method of its own), controller.py under 400 lines, and the Trainer's attributes are
  set once in __init__ (what changes as the run goes is its RunRecord, or passed and
  returned). Catches the flow growing back into one long method, and state parked in
  attributes for another method (or module) to find."""
  path = REPO / "trainer" / "loop" / "controller.py"
  source = path.read_text()
  assert len(source.splitlines()) < 400
  (trainer,) = [node for node in ast.parse(source).body
                if isinstance(node, ast.ClassDef) and node.name == "Trainer"]
  methods = {node.name: node for node in trainer.body if isinstance(node, ast.FunctionDef)}
  assert methods["train"].end_lineno - methods["train"].lineno + 1 <= 40
  assert "_end_of_run" in methods
  assert _attributes_set_outside_init(trainer) == []


def test_the_attribute_rule_sees_each_kind_of_assignment():
  source = ("class Trainer:\n  def __init__(self):\n    self.a = 1\n"
            "  def f(self):\n    self.b = 1\n    self.c += 1\n    self.d, x = 1, 2\n"
            "    self.e: int = 1\n    self.run.f = 1\n")
  (cls,) = ast.parse(source).body
  assert [line.split(":")[1].strip().split()[0] for line in _attributes_set_outside_init(cls)] == [
      "self.b", "self.c", "self.d", "self.e"]

# What only the store (trainer/store/files.py, writer_lock.py, mirror.py) may do: a
# rename, a lock, a file opened for writing. Anywhere else it is a second writer with
# its own guarantees (no fsync, no one-line StorageError, never in the bucket).
_STORE_ONLY_CALLS = {("os", "replace"), ("os", "rename"), ("os", "renames"), ("shutil", "move"),
                     ("fcntl", "flock"), ("fcntl", "lockf")}


def _writes_outside_the_store(path: pathlib.Path) -> list[str]:
  found = []
  for node in ast.walk(ast.parse(path.read_text())):
    if not isinstance(node, ast.Call):
      continue
    function = node.func
    if (isinstance(function, ast.Attribute) and isinstance(function.value, ast.Name)
        and (function.value.id, function.attr) in _STORE_ONLY_CALLS):
      found.append(f"{function.value.id}.{function.attr} (line {node.lineno})")
    elif isinstance(function, ast.Name) and function.id == "open":
      mode = node.args[1] if len(node.args) > 1 else next(
          (keyword.value for keyword in node.keywords if keyword.arg == "mode"), None)
      if mode is not None and not (isinstance(mode, ast.Constant)
                                   and not set(str(mode.value)) & set("wax+")):
        found.append(f"open for writing (line {node.lineno})")
    elif (isinstance(function, ast.Attribute) and function.attr == "open"
          and isinstance(function.value, ast.Name) and function.value.id == "os"
          and any(isinstance(flag, ast.Attribute) and flag.attr in ("O_WRONLY", "O_RDWR",
                                                                     "O_CREAT", "O_APPEND")
                  for argument in node.args[1:2] for flag in ast.walk(argument))):
      found.append(f"os.open for writing (line {node.lineno})")
  return found


def test_only_the_store_renames_locks_or_opens_a_file_for_writing():
  """Every file distloop writes goes through trainer/store/: one atomic writer, one lock."""
  offenders = {}
  for path in sorted((REPO / "trainer").rglob("*.py")):
    relative = path.relative_to(REPO / "trainer")
    if relative.parts[0] == "store":
      continue
    found = _writes_outside_the_store(path)
    if found:
      offenders[f"trainer/{relative}"] = found
  assert not offenders


def test_the_store_rule_sees_each_kind_of_write(tmp_path):
  """The check above can fail: each way of writing, planted in a module, is found."""
  module = tmp_path / "planted.py"
  module.write_text("import fcntl, os, shutil\n"
                    "os.replace('a', 'b')\nos.rename('a', 'b')\nshutil.move('a', 'b')\n"
                    "fcntl.flock(0, fcntl.LOCK_EX)\nopen('a', 'w')\nopen('a', mode='ab')\n"
                    "open('a', 'r+')\nos.open('a', os.O_WRONLY | os.O_CREAT)\n"
                    "open('a')\nopen('a', 'rb')\nos.open('a', os.O_RDONLY)\n")
  assert len(_writes_outside_the_store(module)) == 8
