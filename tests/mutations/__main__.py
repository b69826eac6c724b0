"""`python -m tests.mutations [--only NAME[,NAME]] [--list] [--baseline] [--json FILE]
[--keep] [--markdown] [--timeout SECONDS] [--slice NODE_ID ...]`: plants each bug of the
catalogue in a scratch copy of the working tree and runs the slice that must catch it
(tests/mutations/__init__.py says what the results mean). Exit 0 only if every mutation run
is CAUGHT. `--slice` runs other tests instead of the catalogue's slice (does this file catch
that bug too? is it a blind spot?)."""
import argparse
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

from tests.mutations import REPO, markdown_table
from tests.mutations.catalogue import CATALOGUE

# One process (the machine's cores are shared), no cache written into the copy, stop at the
# first failing test (a catch needs one), slow tests included when a slice names them.
PYTEST = ("-p", "no:cacheprovider", "-n", "0", "-x", "-q", "--no-header", "-m",
          "slow or not slow")


def _working_tree_files() -> list[str]:
  """The files a clone of HEAD plus the working tree's changes holds: tracked files as they
  are on disk (deleted ones left out) and untracked ones that git does not ignore."""
  listed = subprocess.run(
      ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
      check=True, capture_output=True).stdout.decode().split("\0")
  return sorted({name for name in listed if name and os.path.isfile(os.path.join(REPO, name))})


def _scratch_copy(parent: str, files: list[str]) -> str:
  """`parent`/repo: the working tree's files; `parent`/shared -> the checkout's ../shared
  where there is one (tests read ../shared/data)."""
  root = os.path.join(parent, "repo")
  for name in files:
    destination = os.path.join(root, name)
    os.makedirs(os.path.dirname(destination), exist_ok=True)
    shutil.copy2(os.path.join(REPO, name), destination, follow_symlinks=False)
  shared = os.path.join(os.path.dirname(REPO), "shared")
  if os.path.isdir(shared):
    os.symlink(shared, os.path.join(parent, "shared"))
  return root


def _environment(root: str) -> dict:
  """The copy's packages first for the tests and every process they start (an editable
  install of another checkout would be found otherwise)."""
  path = os.environ.get("PYTHONPATH")
  # COLUMNS: pytest's summary lines keep the failure's reason (the JSON's "summary").
  return {**os.environ, "PYTHONPATH": root + (os.pathsep + path if path else ""),
          "COLUMNS": "250"}


def _check_imports_from(root: str) -> None:
  origin = subprocess.run(
      [sys.executable, "-c", "import importlib.util as u; print(u.find_spec('trainer').origin)"],
      cwd=root, env=_environment(root), check=True, capture_output=True, text=True).stdout.strip()
  if not origin.startswith(root):
    raise SystemExit(f"the scratch copy's tests would import trainer from {origin}, not {root}")


def _run_slice(root: str, mutation, log_name: str, timeout: float) -> tuple[str, float, str]:
  """(pytest's exit: "passed", "failed", "error" or "timeout"; seconds; its summary line)."""
  log_path = os.path.join(os.path.dirname(root), log_name)
  start = time.perf_counter()
  with open(log_path, "w") as log:
    try:
      code = subprocess.run([sys.executable, "-m", "pytest", *PYTEST, *mutation.slice],
                            cwd=root, env=_environment(root), stdout=log,
                            stderr=subprocess.STDOUT, timeout=timeout).returncode
    except subprocess.TimeoutExpired:
      code = None
  seconds = time.perf_counter() - start
  with open(log_path, errors="replace") as log:
    lines = [line.strip() for line in log if line.strip()]
  summary = lines[-1].strip("= ") if lines else ""
  outcome = {None: "timeout", 0: "passed", 1: "failed"}.get(code, "error")
  failed = [line for line in lines if line.startswith(("FAILED ", "ERROR "))]
  return outcome, seconds, "; ".join([summary, *failed])


_VERDICTS = {"failed": "CAUGHT", "passed": "MISSED", "error": "ERROR", "timeout": "TIMEOUT"}


def _run(mutation, files: list[str], args) -> dict:
  row = {"name": mutation.name, "plants": mutation.plants,
         "files": sorted({edit.file for edit in mutation.edits}),
         "slice": list(mutation.slice)}
  stale = mutation.stale()
  if stale:
    print(f"  STALE: {stale}", flush=True)
    return {**row, "result": "STALE", "seconds": 0.0, "summary": stale}
  parent = tempfile.mkdtemp(prefix=f"mutation-{mutation.name}-")
  try:
    root = _scratch_copy(parent, files)
    _check_imports_from(root)
    if args.baseline:
      outcome, seconds, summary = _run_slice(root, mutation, "baseline.log", args.timeout)
      row.update(baseline=outcome, baseline_seconds=round(seconds, 1))
      print(f"  baseline (unmutated): {outcome} in {seconds:.1f} s ({summary})", flush=True)
      if outcome != "passed":
        return {**row, "result": "BASELINE FAILED", "seconds": 0.0, "summary": summary}
    mutation.plant(root)
    outcome, seconds, summary = _run_slice(root, mutation, "mutated.log", args.timeout)
    verdict = _VERDICTS[outcome]
    print(f"  {verdict} in {seconds:.1f} s ({summary})", flush=True)
    if args.keep:
      print(f"  kept: {root} (mutated; pytest's output in {parent}/*.log)", flush=True)
    return {**row, "result": verdict, "seconds": round(seconds, 1), "summary": summary}
  finally:
    if not args.keep:
      shutil.rmtree(parent, ignore_errors=True)


def _table(rows: list[dict]) -> str:
  header = ("mutation", "plants", "slice", "result", "seconds")
  cells = [(row["name"], row["plants"], " ".join(row["slice"]), row["result"],
            f"{row['seconds']:.1f}") for row in rows]
  widths = [max(len(header[i]), *(len(cell[i]) for cell in cells)) for i in range(4)]
  lines = []
  for cell in [header, *cells]:
    lines.append("  ".join([*(cell[i].ljust(widths[i]) for i in range(4)),
                            cell[4].rjust(7)]).rstrip())
  return "\n".join(lines)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(prog="python -m tests.mutations", description=__doc__)
  parser.add_argument("--only", default="", help="NAME[,NAME]: run only these mutations")
  parser.add_argument("--list", action="store_true",
                      help="print the catalogue (STALE entries marked) without running it")
  parser.add_argument("--markdown", action="store_true",
                      help="print docs/testing.md's table of the catalogue")
  parser.add_argument("--baseline", action="store_true",
                      help="first run each slice unmutated: it must pass (twice the time)")
  parser.add_argument("--json", metavar="FILE", help="also write the table as JSON to FILE")
  parser.add_argument("--keep", action="store_true",
                      help="keep each scratch copy, mutated, with pytest's output")
  parser.add_argument("--timeout", type=float, default=900.0,
                      help="seconds a slice may run (default 900)")
  parser.add_argument("--slice", nargs="+", metavar="NODE_ID",
                      help="run these tests (pytest node ids or files) instead of each "
                           "mutation's slice")
  args = parser.parse_args(argv)

  names = [name.strip() for name in args.only.split(",") if name.strip()]
  known = {mutation.name for mutation in CATALOGUE}
  unknown = [name for name in names if name not in known]
  if unknown:
    parser.error(f"no mutation named {', '.join(unknown)} (--list shows the catalogue)")
  selected = [m for m in CATALOGUE if not names or m.name in names]
  if args.slice:
    selected = [dataclasses.replace(m, slice=tuple(args.slice)) for m in selected]

  if args.markdown:
    print(markdown_table(selected))
    return 0
  if args.list:
    for mutation in selected:
      stale = mutation.stale()
      print(f"{mutation.name}{'  [STALE: ' + stale + ']' if stale else ''}\n"
            f"  plants: {mutation.plants}\n"
            f"  in:     {', '.join(dict.fromkeys(e.file for e in mutation.edits))}\n"
            f"  slice:  {' '.join(mutation.slice)}")
    return 1 if any(m.stale() for m in selected) else 0

  files = _working_tree_files()
  rows, start = [], time.perf_counter()
  for i, mutation in enumerate(selected, 1):
    print(f"[{i}/{len(selected)}] {mutation.name}: {mutation.plants}\n"
          f"  slice: {' '.join(mutation.slice)}", flush=True)
    rows.append(_run(mutation, files, args))
  print(f"\n{_table(rows)}\n")
  caught = sum(row["result"] == "CAUGHT" for row in rows)
  print(f"{caught} of {len(rows)} caught in {time.perf_counter() - start:.0f} s")
  if args.json:
    with open(args.json, "w") as f:
      json.dump(rows, f, indent=1)
  return 0 if caught == len(rows) else 1


if __name__ == "__main__":
  sys.exit(main())
