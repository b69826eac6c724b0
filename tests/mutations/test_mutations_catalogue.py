"""The catalogue of planted bugs (tests/mutations/) cannot rot unnoticed: every entry's
text occurs exactly once in its file (no STALE entry), each plants a bug in the product
(trainer/, input_pipelines/), each slice names tests that exist, and docs/testing.md's
table is the catalogue's. Static: reads text, runs no mutation (`python -m tests.mutations`
does: docs/testing.md "Mutations")."""
import pathlib
import re

import pytest

from tests.mutations import REPO, markdown_table
from tests.mutations.catalogue import CATALOGUE

_ROOT = pathlib.Path(REPO)


@pytest.mark.parametrize("mutation", CATALOGUE, ids=lambda mutation: mutation.name)
def test_each_mutation_can_be_planted_in_the_product(mutation):
  assert mutation.stale() is None, f"STALE: {mutation.stale()}"
  for edit in mutation.edits:
    assert edit.file.startswith(("trainer/", "input_pipelines/")), edit.file
  assert mutation.plants and "\n" not in mutation.plants


@pytest.mark.parametrize("mutation", CATALOGUE, ids=lambda mutation: mutation.name)
def test_each_slice_names_tests_that_exist(mutation):
  assert mutation.slice
  for node in mutation.slice:
    path, _, rest = node.partition("::")
    assert (_ROOT / path).is_file(), node
    if rest:
      function = rest.split("::")[-1].split("[")[0]
      assert re.search(rf"^\s*def {re.escape(function)}\(", (_ROOT / path).read_text(),
                       flags=re.M), node


def test_names_are_unique():
  names = [mutation.name for mutation in CATALOGUE]
  assert len(names) == len(set(names)) and all(re.fullmatch(r"[a-z0-9_]+", n) for n in names)


def test_the_docs_table_is_the_catalogue():
  """docs/testing.md holds `python -m tests.mutations --markdown`'s table as it prints it."""
  assert markdown_table(CATALOGUE) in (_ROOT / "docs" / "testing.md").read_text(), (
      "regenerate docs/testing.md's table: python -m tests.mutations --markdown")
