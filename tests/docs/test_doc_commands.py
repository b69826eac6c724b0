"""The docs' commands and Python blocks run as written (tests/docs/test_doc_blocks.py checks that
every other block is marked), and the names the docs give a run's outputs are what a run
writes.

Each unmarked ```bash block of docs/*.md runs command by command, each exiting 0, in a
folder laid out as a fresh clone (examples/ there, distloop importable as after
`pip install -e .`); the ```python blocks then run in one interpreter, in reading order (a
block whose first line is `# NAME.py` is written as that file first, as the README's are).
Changed from the page, and only this: /tmp/distloop/... and /data/... lie under the test's
tmp folder; a training command gets `--config.train.steps=2 --config.train.steps_per_loop=1`
appended (CI time; its flags and config are still the page's), except those whose output a
later block reads (FULL_RUNS). A block reading a model_dir the docs made elsewhere runs
after that command (PREREQUISITES: the README's quickstart). The launcher's commands run
in a private network namespace (tests/support/processes.py), skipped without one; one the README
shows too is left to tests/docs/test_readme.py, which runs it as written (_RUN_BY_THE_README_TEST),
and verify's is left to tests/verify/test_verify.py (_RUN_BY_OTHER_TESTS)."""
import csv
import json
import os
import re
import subprocess
import sys

import pytest

from tests.support.cli import user_environment
from tests.support.doc_blocks import REPO, as_run_here, doc_blocks, page_blocks
from tests.docs import test_readme
from tests.verify import test_verify
from tests.support.processes import loopback_only, needs_loopback

_QUICKSTART = "python -m trainer --config=synthetic --model_dir=/tmp/distloop/synthetic"
# A model_dir a block reads -> the documented command that makes it.
PREREQUISITES = {"/tmp/distloop/synthetic": _QUICKSTART,
                 "/tmp/distloop/spirals/export/600": "python -m trainer "
                 "--config=examples/my_config.py --model_dir=/tmp/distloop/spirals"}
FULL_RUNS = set(PREREQUISITES.values())  # their steps are read later: as written
_CHEAP = ["--config.train.steps=2", "--config.train.steps_per_loop=1"]

# Commands tests/docs/test_readme.py runs as written already (the launch, mirrored: ~50 s saved).
_RUN_BY_THE_README_TEST = {" ".join(command.split()) for command in test_readme.commands()}
# Commands another test runs as written, and more (the seed CNN's verify: ~90 s saved).
_RUN_BY_OTHER_TESTS = {test_verify.DOCUMENTED}
_BLOCKS = doc_blocks()
_BASH = [b for b in _BLOCKS if not b.mark and b.language == "bash"]
_LOCAL = [b for b in _BASH if not any("trainer.launch" in c for c in b.commands())]
_LAUNCH = [b for b in _BASH if b not in _LOCAL]


@pytest.fixture(scope="module")
def clone(tmp_path_factory):
  """A user's folder: the repository's examples/, the docs' files; runs each command once."""
  folder = tmp_path_factory.mktemp("clone")
  os.symlink(os.path.join(REPO, "examples"), folder / "examples")
  for block in _BLOCKS:
    first = block.body.splitlines()[0] if block.body else ""
    if not block.mark and block.language == "python" and re.match(r"# [\w.]+\.py\b", first):
      (folder / first[2:].split(":")[0].strip()).write_text(block.body)
  ran = {}

  def run(command: str, prefix=()) -> subprocess.CompletedProcess:
    if command not in ran:
      argv = as_run_here(command, folder)
      trains = (command.startswith(("python -m trainer ", "python -m trainer.launch "))
                and not re.search(r"--mode=(eval|continuous_eval|export|predict)", command))
      if trains and command not in FULL_RUNS:
        argv += _CHEAP
      ran[command] = subprocess.run(
          [*prefix, *argv], cwd=folder, capture_output=True, text=True, timeout=600,
          env={**user_environment(), "PYTHONPATH": str(REPO)})
    return ran[command]

  run.folder = folder
  return run


def _check(clone, command, prefix=()):
  for path, prerequisite in PREREQUISITES.items():
    if path in command and prerequisite != command:
      _check(clone, prerequisite)
  completed = clone(command, prefix)
  assert completed.returncode == 0, f"{command}\nexit {completed.returncode}\n" \
                                    f"{completed.stderr[-4000:]}"
  return completed


@pytest.mark.slow
@pytest.mark.parametrize("block", _LOCAL, ids=lambda b: b.where)
def test_each_documented_command_runs_as_written(clone, block):
  for command in block.commands():
    if command not in _RUN_BY_THE_README_TEST | _RUN_BY_OTHER_TESTS:
      _check(clone, command)


@pytest.mark.slow
def test_the_documented_python_blocks_run_as_written(clone):
  program = "\n".join(block.body.replace("/tmp/distloop/", f"{clone.folder}/")
                      for block in _BLOCKS if not block.mark and block.language == "python"
                      and not re.match(r"# [\w.]+\.py\b", block.body))
  for path, prerequisite in PREREQUISITES.items():
    if path in program:
      _check(clone, prerequisite)
  completed = subprocess.run([sys.executable, "-c", program], cwd=clone.folder,
                             capture_output=True, text=True, timeout=600,
                             env={**user_environment(), "PYTHONPATH": str(REPO)})
  assert completed.returncode == 0, completed.stderr[-4000:]


@pytest.mark.slow
@needs_loopback
@pytest.mark.parametrize("block", _LAUNCH, ids=lambda b: b.where)
def test_each_documented_launch_runs_as_written(clone, block):
  for command in block.commands():
    if command not in _RUN_BY_THE_README_TEST:
      _check(clone, command, prefix=loopback_only())


# -- the names the docs give a run's outputs -------------------------------------------

def _section(page: str, start: str) -> str:
  return (REPO / "docs" / page).read_text(encoding="utf-8").split(start, 1)[1]


def _row(page: str, first_cell: str) -> str:
  return re.search(rf"^\| `{re.escape(first_cell)}` \|(.*)$", _section(page, "# "), re.M).group(1)


@pytest.fixture(scope="module")
def quickstart(clone):
  """The model_dir of the README's quickstart (synthetic: random-access data, accuracy)."""
  _check(clone, _QUICKSTART)
  return clone.folder / "synthetic"


@pytest.mark.slow
def test_the_documented_metric_names_are_what_a_run_writes(quickstart):
  """docs/monitoring.md's TensorBoard table (scalars) and the tensorboard/train/ row, against
  the (split, name) pairs of metrics.csv, which holds every scalar TensorBoard gets."""
  with open(quickstart / "metrics.csv", encoding="utf-8") as f:
    written = {f"{row['split']}/{row['name']}" for row in csv.DictReader(f)}
  table = _section("monitoring.md", "| run / tag | what it means |").split("\n\n", 1)[0]
  documented, opt_in = set(), set()
  for row in table.strip().splitlines():
    tag_cell, meaning = row.split("|")[1:3]
    if not re.search(r"Text tab|Images tab|GRAPHS|HPARAMS", tag_cell):
      tags = set(re.findall(r"`((?:train|eval)/\w+)`", tag_cell))
      # "with `train.FIELD=true`: ...": written only when that field is set (off here).
      (opt_in if re.match(r"\s*with `[\w.]+=true`", meaning) else documented).update(tags)
  per_loop = _row("monitoring.md", "tensorboard/train/").split("; once:")[0]
  opt_in |= {f"train/{name}" for name in re.findall(r"`(\w+)` \(with `[\w.]+`\)", per_loop)}
  per_loop = re.sub(r"`\w+` \(with `[\w.]+`\)", "", per_loop)
  documented |= {f"train/{name}" for name in re.findall(r"`(\w+)`", per_loop)}
  assert len(documented) >= 9 and opt_in, (documented, opt_in)
  assert documented <= written, f"documented, not written: {documented - written}"
  assert not opt_in & written, f"documented as opt-in, written by default: {opt_in & written}"


@pytest.mark.slow
def test_the_documented_summary_and_finished_keys_are_what_a_run_writes(quickstart):
  summary = json.loads((quickstart / "summary.json").read_text())
  listed = _row("monitoring.md", "summary.json").split("; strict JSON")[0]
  keys = {key for key in re.findall(r"`(\w+)`", listed)}
  assert keys - set(summary) == set(), f"documented, not in summary.json: {keys - set(summary)}"
  finished = json.loads((quickstart / "finished.json").read_text())
  keys = set(re.findall(r'"(\w+)"', _row("monitoring.md", "finished.json").split(":", 1)[1]
                        .split("}")[0])) - {"train", "stopped"}
  assert keys and keys <= set(finished), f"documented {keys}, written {set(finished)}"


def test_the_blocks_these_tests_run_are_found():
  """A marker or fence typo must not quietly empty the lists above."""
  assert len(_LOCAL) >= 8 and len(_LAUNCH) >= 1
  assert all(b.page.name for b in _BASH) and page_blocks(REPO / "docs" / "monitoring.md")


@pytest.mark.slow
def test_the_eval_mode_prints_the_documented_keys(clone):
  """docs/monitoring.md: `--mode=eval` "Prints {"step", "loss", ...}" (its run is shared
  with the block's test above)."""
  (block,) = [b for b in _LOCAL if "--mode=eval --checkpoint_step" in b.body]
  documented = set(re.findall(r'"(\w+)"', re.search(r"Prints (\{.*?\})", block.body).group(1)))
  command = next(c for c in block.commands() if "--checkpoint_step" in c)
  printed = json.loads(_check(clone, command).stdout)
  assert documented == set(printed), f"documented {documented}, printed {set(printed)}"
  assert printed["step"] == 200
