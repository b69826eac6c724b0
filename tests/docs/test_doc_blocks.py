"""The docs' code cannot rot unnoticed (static half; tests/docs/test_doc_commands.py runs them):

- every code block of docs/*.md is run by a test or marked (tests/support/doc_blocks.py): an
  unmarked block is a `bash` block of `python -m trainer|trainer.launch|input_pipelines.
  convert` commands, or a `python` block; anything else must say why it is not run;
- an excerpt's lines are in the file it names;
- a command not run here names a config that exists (test_docs checks its flags and fields);
- the names the docs give distloop's outputs are the code's: the model_dir's files and
  folders (trainer/store/model_dir.py), the exit codes (trainer/errors.py) and the value
  names a Task's step may not return (trainer/loop/step_values.py).
Reads text and source; imports no TensorFlow."""
import ast
import re

import pytest

import configs
from tests.support.doc_blocks import DOC_PAGES, REPO, doc_blocks, excerpt_misses, runnable

_BLOCKS = doc_blocks()


def _constants(module: str) -> dict:
  """The module-level constants of a source file, read without importing it."""
  tree = ast.parse((REPO / module).read_text(encoding="utf-8"))
  found = {}
  for node in tree.body:
    if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
      try:  # a literal, or one made of the names before it (`(..., LOCK_NAME)`)
        found[node.targets[0].id] = eval(  # pylint: disable=eval-used
            compile(ast.Expression(node.value), module, "eval"), {"__builtins__": {}}, found)
      except Exception:  # pylint: disable=broad-except  (a call, an import: not a constant)
        pass
  return found


def test_every_code_block_is_run_or_marked():
  unaccounted = []
  for block in _BLOCKS:
    if block.mark in ("excerpt", "not run here") and not block.detail:
      unaccounted.append(f"{block.where}: `{block.mark}` without a file or a reason")
    elif block.mark:
      continue
    elif block.language == "bash":
      unaccounted += [f"{block.where}: not a command a test runs: {command}"
                      for command in block.commands() if not runnable(command)]
    elif block.language != "python":
      unaccounted.append(f"{block.where}: a ```{block.language} block, neither run nor marked")
  assert not unaccounted, "\n".join(unaccounted + ["(see docs/testing.md, code blocks)"])
  assert len(_BLOCKS) >= 30  # it read the pages


@pytest.mark.parametrize("block", [b for b in _BLOCKS if b.mark == "excerpt"],
                         ids=lambda b: b.where)
def test_each_excerpt_is_in_its_file(block):
  assert (REPO / block.detail).is_file(), f"{block.where}: no file {block.detail}"
  misses = excerpt_misses(block)
  assert not misses, f"{block.where}: lines not in {block.detail}: {misses}"


def test_each_command_not_run_here_names_a_config_that_exists():
  named = [(block.where, m.group(1)) for block in _BLOCKS if block.mark == "not run here"
           for command in block.commands() if runnable(command)
           for m in [re.search(r"--config=(\S+)", command)] if m]
  missing = [f"{where}: --config={name}" for where, name in named
             if name not in configs.NAMES and not (REPO / name).is_file()]
  assert not missing, missing
  assert len(named) >= 3


def _page(name: str) -> str:
  return (REPO / "docs" / name).read_text(encoding="utf-8")


def test_the_model_dir_table_names_what_the_code_writes():
  """Both ways: a path the table lists that the layout lacks, and a file or folder the
  layout has that the table leaves out."""
  layout = _constants("trainer/store/model_dir.py")
  written = {*layout["_DIRECTORIES"], *layout["_FILES"], layout["LOCK_NAME"]}
  section = _page("monitoring.md").split("## Outputs in model_dir", 1)[1]
  documented = {path.split("/")[0] for path in re.findall(r"^\| `([^`]+)` \|", section, re.M)}
  assert documented - written == set(), f"documented, not in model_dir.py: {documented - written}"
  assert written - documented == set(), f"in model_dir.py, not documented: {written - documented}"


def test_the_exit_codes_the_docs_name_are_the_codes_table():
  codes = {name: value for name, value in _constants("trainer/errors.py").items()
           if name.startswith("EXIT_")}
  named = {int(n) for page in DOC_PAGES + [REPO / "README.md"]
           for n in re.findall(r"\bexit(?:s| code| with)? (\d+)\b", page.read_text())}
  assert named <= set(codes.values()), f"exit codes the docs name that trainer/errors.py " \
                                       f"lacks: {named - set(codes.values())} (has {codes})"
  assert set(codes.values()) <= named, f"undocumented exit codes: {set(codes.values()) - named}"


def test_the_reserved_value_names_are_the_steps():
  """docs/tasks.md lists the names a Task's step may not return: trainer/loop/step_values.py's."""
  reserved = _constants("trainer/loop/step_values.py")["RESERVED"]
  sentence = re.search(r"names distloop reports itself are reserved: (.*?)\.\s",
                       _page("tasks.md"), re.S).group(1)
  assert set(re.findall(r"`([^`]+)`", sentence)) == set(reserved)
