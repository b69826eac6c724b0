"""Planted bugs (mutations): each guarantee-breaking bug the suite must catch, as data.

`python -m tests.mutations` copies the working tree (tracked files and untracked ones git
does not ignore: uncommitted changes included) to a scratch folder per mutation, plants
the bug there, runs the slice of tests that must catch it, and prints a table: CAUGHT
(the slice failed), MISSED (it passed: a blind spot of the suite), STALE (the text to
replace is not in its file exactly once: the code changed under the entry), ERROR (the
slice could not run: a node id that does not exist, a mutated module that does not
import), TIMEOUT. It exits 0 only if every mutation is CAUGHT. docs/testing.md
"Mutations" says how to run it; tests/mutations/test_mutations_catalogue.py keeps the catalogue
from rotting (no STALE entry, every slice's tests exist, the docs' table in sync).

A mutation is one `Mutation` in catalogue.py's CATALOGUE: to add one, append an entry.
"""
import dataclasses
import os

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@dataclasses.dataclass(frozen=True)
class Edit:
  """In `file` (relative to the repository root) the text `old`, which must occur exactly
  once, becomes `new`."""
  file: str
  old: str
  new: str


@dataclasses.dataclass(frozen=True)
class Mutation:
  """A planted bug: `name`; `plants`, what it breaks, in one line; the edit (`file`, `old`
  -> `new`, plus `also`: further edits of the same bug); `slice`: pytest node ids that must
  catch it (run with `-m "slow or not slow"`, so a slow test or a guarantee-matrix cell
  named here runs too; prefer fast ones: each slice should finish in under ~3 minutes on
  2 cores)."""
  name: str
  plants: str
  file: str
  old: str
  new: str
  slice: tuple[str, ...]
  also: tuple[Edit, ...] = ()

  @property
  def edits(self) -> tuple[Edit, ...]:
    return (Edit(self.file, self.old, self.new), *self.also)

  def stale(self, root: str = REPO) -> str | None:
    """Why the mutation cannot be planted in the tree at `root` (None: it can): each edit's
    text must occur exactly once in its file."""
    for edit in self.edits:
      path = os.path.join(root, edit.file)
      if not os.path.isfile(path):
        return f"{edit.file} does not exist"
      with open(path, encoding="utf-8") as f:
        count = f.read().count(edit.old)
      if count != 1:
        return f"{edit.file} holds the text to replace {count} times, not once: {edit.old[:60]!r}"
      if edit.old == edit.new:
        return f"{edit.file}: the replacement is the text itself"
    return None

  def plant(self, root: str) -> None:
    """Applies the edits to the tree at `root` (a scratch copy, never the repository)."""
    for edit in self.edits:
      path = os.path.join(root, edit.file)
      with open(path, encoding="utf-8") as f:
        text = f.read()
      with open(path, "w", encoding="utf-8") as f:
        f.write(text.replace(edit.old, edit.new, 1))


def markdown_table(mutations) -> str:
  """docs/testing.md's table of the catalogue (`python -m tests.mutations --markdown`)."""
  rows = ["| mutation | what it plants | file | the slice that catches it |",
          "| --- | --- | --- | --- |"]
  for mutation in mutations:
    files = ", ".join(dict.fromkeys(f"`{edit.file}`" for edit in mutation.edits))
    tests = "<br>".join(f"`{node}`" for node in mutation.slice)
    rows.append(f"| `{mutation.name}` | {mutation.plants.replace('|', '/')} | {files} | {tests} |")
  return "\n".join(rows)
