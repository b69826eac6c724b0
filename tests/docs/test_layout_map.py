"""docs/layout.md is the newcomer's map: one paragraph per folder. Each product folder's
paragraph names every module and subfolder in it, and nothing that is gone; every
top-level folder has its paragraph. A module added, moved or removed without its line in
the map fails here."""
import pathlib
import re

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
MAP = REPO / "docs" / "layout.md"
# The folders whose every module the map names (the code a reader navigates).
_PACKAGES = ("trainer", "input_pipelines", "models", "configs")


def _sections() -> dict[str, str]:
  """{folder: its paragraph}, from the map's `### `folder/`` headings."""
  sections, current = {}, None
  for line in MAP.read_text().splitlines():
    heading = re.fullmatch(r"### `([\w/.-]+)/`.*", line)
    if heading:
      current = heading.group(1)
      sections[current] = ""
    elif line.startswith("#"):
      current = None
    elif current is not None:
      sections[current] += line + "\n"
  return sections


def _product_folders() -> list[str]:
  folders = []
  for package in _PACKAGES:
    root = REPO / package
    folders += [str(path.relative_to(REPO)) for path in [root, *sorted(root.rglob("*"))]
                if path.is_dir() and path.name != "__pycache__"
                and (path / "__init__.py").is_file()]
  return folders


def _entries(folder: str) -> set[str]:
  """What `ls folder` shows a reader: its modules and its packages."""
  path = REPO / folder
  return ({p.name for p in path.glob("*.py") if p.name != "__init__.py"}
          | {f"{p.name}/" for p in path.iterdir()
             if p.is_dir() and (p / "__init__.py").is_file()})


@pytest.mark.parametrize("folder", _product_folders())
def test_each_product_folders_paragraph_names_exactly_what_it_holds(folder):
  sections = _sections()
  assert folder in sections, f"docs/layout.md has no `### `{folder}/`` paragraph"
  named = set(re.findall(r"`([\w]+\.py|[\w]+/)`", sections[folder]))
  actual = _entries(folder)
  assert named == actual, (f"docs/layout.md's {folder}/: missing {sorted(actual - named)}, "
                           f"gone {sorted(named - actual)}")


def test_every_top_level_folder_has_a_paragraph():
  folders = {path.name for path in REPO.iterdir()
             if path.is_dir() and not path.name.startswith((".", "_"))
             and not path.name.endswith(".egg-info") and path.name not in ("build", "dist")}
  assert folders <= set(_sections()), sorted(folders - set(_sections()))


def test_the_tests_paragraph_names_every_folder_of_tests():
  """A new folder of tests (or one gone) changes the map's tests/ paragraph with it."""
  named = set(re.findall(r"`([\w]+)/`", _sections()["tests"]))
  actual = {path.name for path in (REPO / "tests").iterdir()
            if path.is_dir() and path.name != "__pycache__"}
  assert named >= actual and named - actual <= {"workloads"}, (
      f"docs/layout.md's tests/: missing {sorted(actual - named)}, gone {sorted(named - actual - {'workloads'})}")
