"""The arrows of the layout point one way: trainer/ uses input_pipelines/ and models/,
never the reverse (DESIGN.md), so the data and model registries can be read, reused
and tested without the loop."""
import ast
import pathlib

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent


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
