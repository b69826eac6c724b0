"""The code blocks of README.md and docs/*.md, as the doc tests read them (one place for
tests/docs/test_readme.py, tests/docs/test_doc_blocks.py and tests/docs/test_doc_commands.py).

A block is run by a test unless the line right before its fence marks it (docs/testing.md,
"Code blocks in the docs"):

  <!-- doc-test: excerpt tests/plugins/multi_output_plugins.py -->   lines of a file a test runs
  <!-- doc-test: output -->                                   printed text, a synopsis, a tree
  <!-- doc-test: not run here: needs a Kubernetes cluster --> the reason; flags and fields
                                                              are still checked statically
"""
import dataclasses
import pathlib
import re
import shlex
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]
DOC_PAGES = sorted((REPO / "docs").glob("*.md"))
# The commands a doc test runs; any other command in an unmarked block is an error.
RUNNABLE = ("python -m trainer ", "python -m trainer.launch ", "python -m trainer.verify ",
            "python -m trainer.inspect ", "python -m input_pipelines.convert ")
MARKER = re.compile(r"<!-- doc-test: (excerpt|output|not run here)(?::? (.*?))? -->")


@dataclasses.dataclass
class Block:
  page: pathlib.Path
  line: int            # the fence's line, 1-based
  language: str
  body: str
  mark: str = ""       # "", "excerpt", "output", "not run here"
  detail: str = ""     # the excerpt's file, or why it is not run here

  @property
  def where(self) -> str:
    return f"{self.page.relative_to(REPO)}:{self.line}"

  def commands(self) -> list[str]:
    """The block's shell commands: continuations joined, comments and blank lines dropped."""
    lines = self.body.replace("\\\n", " ").splitlines()
    return [" ".join(line.split()) for line in (re.sub(r"(^|\s)#.*", "", text) for text in lines)
            if line.strip()]


def blocks(text: str) -> list[tuple[str, str]]:
  """(language, body) of each fenced block, in order."""
  return [(language, body) for language, body in
          re.findall(r"^```(\w*)\n(.*?)^```", text, flags=re.S | re.M)]


def page_blocks(page: pathlib.Path) -> list[Block]:
  """Each fenced block of a page with the doc-test marker on the line before it, if any."""
  text = page.read_text(encoding="utf-8")
  found = []
  for m in re.finditer(r"^```(\S*)\n(.*?)^```", text, flags=re.S | re.M):
    before = text[:m.start()].rstrip("\n").rsplit("\n", 1)[-1]
    marker = MARKER.fullmatch(before.strip())
    found.append(Block(page, text.count("\n", 0, m.start()) + 1, m.group(1), m.group(2),
                       *((marker.group(1), marker.group(2) or "") if marker else ())))
  return found


def doc_blocks() -> list[Block]:
  return [block for page in DOC_PAGES for block in page_blocks(page)]


def runnable(command: str) -> bool:
  return (command + " ").startswith(RUNNABLE)


def as_run_here(command: str, tmp_path) -> list[str]:
  """A documented command as a test runs it: /tmp/distloop/... (model_dirs) and /data/...
  (a user's data) moved under tmp_path, `python` this interpreter."""
  words = [re.sub(r"(^|=)/(?:tmp/distloop|data)/", rf"\g<1>{tmp_path}/", word)
           for word in shlex.split(command)]
  return [sys.executable, *words[1:]]


def code(text: str) -> str:
  """Python source without comments or whitespace, to compare an excerpt with its file."""
  return "".join(re.sub(r"(^|\s)#.*", "", line) for line in text.splitlines()).replace(" ", "")


def excerpt_misses(block: Block) -> list[str]:
  """The lines of an excerpt (comments, blank lines and `...` aside) its file lacks."""
  source = code((REPO / block.detail).read_text(encoding="utf-8"))
  return [line.strip() for line in block.body.splitlines()
          if code(line) not in ("", "...") and code(line) not in source]
