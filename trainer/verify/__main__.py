"""`python -m trainer.verify --config=... [--config.FIELD=VALUE ...] [--steps=N]
[--shapes=1,2] [--workers=W] [--seed=S] [--scratch=DIR] [--keep] [--json=FILE]`

Runs the job the flags describe (as `python -m trainer` would train it) every way a
guarantee names, briefly, and prints a table: each check, whether it holds, the largest
difference and the bound (trainer/verify/checks.py). Exit 0 when every check holds, 1
when one does not (the first step and variable where the runs part, and what usually
causes it), 2 on bad input or a job distloop refuses (its one line).
"""
import argparse
import os

import shutil
import sys
import tempfile
import time

from trainer.verify import checks as checks_module
from trainer.verify import report
from trainer.store import files

EXIT_OK, EXIT_DIFFERS, EXIT_BAD_INPUT = 0, 1, 2


def _parse(argv: list[str]):
  parser = argparse.ArgumentParser(prog="python -m trainer.verify", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--steps", type=int, default=12,
                      help="steps each run trains (default 12; at least 8)")
  parser.add_argument("--shapes", default="1,2",
                      help="replica counts to compare, 1 first (default 1,2; 1 alone: no "
                           "shape checks)")
  parser.add_argument("--workers", type=int, default=0,
                      help="also run the job on this many worker processes (python -m "
                           "trainer.launch, on this machine): bit for bit against as many "
                           "replicas in one process")
  parser.add_argument("--seed", type=int, default=0, help="chooses the SIGKILL's moment")
  parser.add_argument("--scratch", default="",
                      help="where the runs' model_dirs go (default: a temporary folder, "
                           "removed at the end unless --keep)")
  parser.add_argument("--keep", action="store_true", help="keep the scratch folder")
  parser.add_argument("--json", default="", help="also write the report here as JSON")
  parser.add_argument("--timeout", type=float, default=600.0,
                      help="seconds each process may take (default 600)")
  known, rest = parser.parse_known_args(argv)
  config_flags = [flag for flag in rest if flag.split("=", 1)[0] == "--config"
                  or flag.startswith("--config.")]
  others = [flag for flag in rest if flag not in config_flags]
  if any(flag.startswith("--model_dir") or flag.startswith("--mode") for flag in rest):
    raise ValueError("verify runs the job in scratch model_dirs of its own: no --model_dir "
                     "or --mode")
  if others:
    raise ValueError(f"unexpected arguments: {' '.join(others)} (verify takes the job's "
                     f"--config and --config.FIELD=VALUE flags, and its own: --steps, "
                     f"--shapes, --workers, --seed, --scratch, --keep, --json, --timeout)")
  if known.steps < 8:
    raise ValueError(f"--steps={known.steps}: verify needs at least 8 (a SIGTERM, a "
                     f"checkpoint and a SIGKILL after it)")
  try:
    shapes = tuple(int(part) for part in known.shapes.split(",") if part.strip())
  except ValueError:
    shapes = ()
  if not shapes or shapes[0] != 1 or any(n < 1 for n in shapes) or len(set(shapes)) < len(shapes):
    raise ValueError(f"--shapes={known.shapes}: replica counts, 1 first, e.g. 1,2")
  if known.workers == 1 or known.workers < 0:
    raise ValueError(f"--workers={known.workers}: 2 or more (one process is every other run)")
  return known, tuple(config_flags), shapes


def main(argv: list[str]) -> int:
  try:
    known, config_flags, shapes = _parse(argv)
  except ValueError as e:
    print(f"verify: {e}", file=sys.stderr)
    return EXIT_BAD_INPUT
  from input_pipelines.native_output import native_startup_silenced  # pylint: disable=import-outside-toplevel
  with native_startup_silenced():  # this process reads checkpoints and exports
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    gpus = len(tf.config.list_physical_devices("GPU"))
  if gpus and max(shapes) > gpus:
    print(f"verify: --shapes={known.shapes} asks for {max(shapes)} replicas; this machine "
          f"has {gpus} GPU(s)", file=sys.stderr)
    return EXIT_BAD_INPUT
  if gpus and known.workers:
    print("verify: --workers compares workers of one replica each on logical CPU devices; "
          "on a GPU machine each worker would take every GPU: not yet", file=sys.stderr)
    return EXIT_BAD_INPUT
  scratch = known.scratch or tempfile.mkdtemp(prefix="distloop-verify-")
  if known.scratch and os.path.exists(scratch) and os.listdir(scratch):
    print(f"verify: --scratch={scratch} is not empty; give a new or empty folder",
          file=sys.stderr)
    return EXIT_BAD_INPUT
  job = checks_module.Job(config_flags, scratch, steps=known.steps, shapes=shapes,
                          workers=known.workers, seed=known.seed, timeout=known.timeout,
                          gpus=gpus,
                          log=lambda line: print(line, file=sys.stderr, flush=True))
  started = time.monotonic()
  try:
    try:
      checks = checks_module.certify(job)
    except checks_module.JobFailed as e:
      refused = e.code == EXIT_BAD_INPUT
      if e.what == "reference":
        said = (f"distloop refuses the job before its first step: {e.line}" if refused
                else f"the job failed: {e.line}")
      else:
        said = (f"the {e.what} run " if e.what else "a run ") + (
            f"{'was refused' if refused else 'failed'}: {e.line}")
      print(f"verify: {said}", file=sys.stderr)
      if known.json:
        files.write_text(known.json, report.as_json(
            [], flags=list(config_flags), holds=False,
            **{"refused" if refused else "failed": e.line}) + "\n", what="--json")
      return EXIT_BAD_INPUT if refused else EXIT_DIFFERS
    print(report.table(checks), flush=True)
    seconds = time.monotonic() - started
    print(f"verify: {len(checks)} checks in {seconds:.0f} s", file=sys.stderr)
    if known.json:
      files.write_text(known.json, report.as_json(
          checks, flags=list(config_flags), steps=known.steps, shapes=list(shapes),
          workers=known.workers, seed=known.seed, seconds=round(seconds, 1)) + "\n",
          what="--json")
    return EXIT_OK if all(check.holds is not False for check in checks) else EXIT_DIFFERS
  finally:
    if not known.keep and not known.scratch:
      shutil.rmtree(scratch, ignore_errors=True)
    elif known.keep:
      print(f"verify: the runs are in {scratch}", file=sys.stderr)


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
