"""One run against another, on what each wrote: the digests of every step (verify's own
runs record them: trainer/loop/digests.py), the checkpoints, summary.json's evals and the
exports. Each judge sets a `Check`: whether it holds at its bound, the largest difference,
and the first step and variable where the runs part. checks.py runs the job and calls
these; the guarantee harness (tests/guarantees/test_matrix.py) judges its runs with them
too, and tests/verify/test_judging.py on digests written by hand.
"""
import dataclasses
import json
import os

import numpy as np

from trainer.loop import digests
from trainer.verify import processes

BIT_FOR_BIT = "bit for bit"
ROUNDING = "float32 rounding"
REFUSED = "refused in one line"
# Another replica count sums each step in another order: a few ulps per step, carried
# along (docs/guarantees.md). The bound at step t is t * this, on every sampled value: a
# reduction counted twice or missing moves a weight by lr * gradient at step 1 already.
ROUNDING_PER_STEP = 2e-7
# A job more sensitive to the summation order (a contrastive loss over global negatives at
# a high rate: step.all_gather's gradient is the slice of the summed upstream gradient, on
# any replica count) parts by more than that from 1 replica's own rounding. Where another
# replica count exceeds ROUNDING_PER_STEP, the job's 1-replica run is trained again in
# another summation order (oneDNN's kernels off, or on: checks.Job.process) and the replica
# counts are judged against OWN_ROUNDING_FACTOR times what that run parted by, up to each
# step: a gradient counted twice still parts at step 1 by far more.
OWN_ROUNDING = "the job's own rounding"
OWN_ROUNDING_FACTOR = 10.0


@dataclasses.dataclass
class Check:
  """One row of the report."""
  name: str
  bound: str                          # BIT_FOR_BIT | ROUNDING | OWN_ROUNDING | REFUSED
  holds: bool | None = None           # None: not judged (why: `note`)
  largest: float | None = None        # the largest difference measured
  tolerance: float | None = None
  first_step: int | None = None       # where the runs first part
  first_variable: str | None = None
  note: str = ""


def summary(model_dir: str) -> dict:
  """summary.json of a model_dir; {} if it wrote none (yet)."""
  try:
    with open(os.path.join(model_dir, "summary.json")) as f:
      return json.load(f)
  except (OSError, ValueError):
    return {}


def judge_chain(reference: str, chain: str, *, stopped: int, restored: int, last: int,
                killed: str) -> list[Check]:
  """[repeat, sigterm, sigkill] of a chain's model_dir against the uninterrupted
  `reference`, step by step (the steps both recorded), bit for bit, then the end: the
  checkpoints of `last` and the eval each reported (summary.json). `stopped`: the step
  the SIGTERM saved; `restored`: the step the run after the SIGKILL resumed from. The
  guarantee harness judges its workloads' resumes with this too
  (tests/guarantees/test_matrix.py)."""
  ours, theirs = digests.read(reference), digests.read(chain)
  end = last + 1
  sigterm_until = restored if restored > stopped else last
  segments = [
      ("repeat", f"another process of the same job, steps 1-{stopped}", range(1, stopped + 1)),
      ("sigterm", f"SIGTERM at step {stopped}, resumed: steps {stopped + 1}-{sigterm_until}",
       range(stopped + 1, sigterm_until + 1)),
      ("sigkill", f"SIGKILL {killed}, resumed from step {restored}: steps {restored + 1}-"
                  f"{last}", range(restored + 1, end)),
  ]
  checks, parted = [], None
  for name, what, steps in segments:
    check = Check(name, BIT_FOR_BIT, tolerance=0.0, note=what)
    if parted is not None:
      check.note = f"not judged: the runs parted earlier ({parted})"
    else:
      judge_digests(check, ours, theirs, steps, 0.0)
      if check.holds is False:
        parted = name
    checks.append(check)
  if parted is None:  # the end: every variable, and what eval reported (which sees more)
    final = final_difference(reference, chain, last)
    evals = eval_difference(summary(reference), summary(chain))
    if final[1] or evals[1]:
      last_check = checks[-1]
      last_check.holds, last_check.first_step = False, last
      last_check.largest, last_check.first_variable = max((final, evals),
                                                          key=lambda f: f[0])[:2]
  return checks


def judge(check: Check, reference: str, other: str, steps, tolerance) -> None:
  """`judge_digests` on two model_dirs' digests (the guarantee harness judges its runs so)."""
  judge_digests(check, digests.read(reference), digests.read(other), steps, tolerance)


def judge_digests(check: Check, ours: dict, theirs: dict, steps, tolerance) -> None:
  """Sets check.holds and where the runs part (tolerance: a number, or per step), on the
  steps of `steps` both runs recorded (a loop boundary of each: every step of verify's
  runs); not judged (None) if there is none."""
  steps = [step for step in steps if step in ours and step in theirs]
  if not steps:
    check.note += " (no step both runs recorded: not judged)"
    return
  check.largest = 0.0
  for step in steps:
    bound = tolerance(step) if callable(tolerance) else tolerance
    key, difference = digests.step_difference(ours[step], theirs[step], bound)
    if key is not None:
      check.holds = False
      check.first_step, check.first_variable, check.largest = step, key, difference
      return
    check.largest = max(check.largest, difference)
  check.holds = True


def final_difference(ours: str, theirs: str, step: int) -> tuple[float, str | None]:
  """(largest difference, first differing key) of two runs' checkpoints of `step`."""
  return _arrays_difference(processes.read_checkpoint(ours, step),
                            processes.read_checkpoint(theirs, step))


def _arrays_difference(a: dict, b: dict) -> tuple[float, str | None]:
  """(largest difference, first key whose bytes differ) of two {key: array}: inf where a
  key or a shape differs."""
  if a.keys() != b.keys():
    return float("inf"), sorted(a.keys() ^ b.keys())[0]
  worst, first = 0.0, None
  for key in a:
    if a[key].shape != b[key].shape:
      return float("inf"), key
    if a[key].tobytes() != b[key].tobytes():
      first = first or key
      if a[key].dtype.kind in "fiu":
        worst = max(worst, float(np.max(np.abs(a[key].astype(np.float64)
                                               - b[key].astype(np.float64)))))
  return worst, first


def eval_difference(ours: dict, theirs: dict) -> tuple[float, str | None]:
  """(largest difference, first differing key) of the eval values of two summaries
  (summary.json's eval_* keys)."""
  worst, first = 0.0, None
  for key, value in ours.items():
    if key.startswith("eval_") and not key.endswith("_sec") and isinstance(value, float):
      other = theirs.get(key)
      if other != value:
        first = first or f"summary.json {key}"
        worst = max(worst, abs(value - other) if isinstance(other, float) else float("inf"))
  return worst, first


def export_difference(ours: str, theirs: str) -> tuple[float, str | None]:
  import tensorflow as tf  # pylint: disable=import-outside-toplevel

  def variables(export_dir: str) -> dict:
    reader = tf.train.load_checkpoint(os.path.join(export_dir, "variables", "variables"))
    return {name: np.asarray(reader.get_tensor(name))
            for name in sorted(reader.get_variable_to_shape_map())}
  return _arrays_difference(variables(ours), variables(theirs))


def own_rounding(one: dict, reordered: dict) -> dict[int, float]:
  """{step: the largest difference, up to that step, between the 1-replica run and the same
  run in another summation order} (their digests' samples): how far this job's own
  rounding carries it."""
  largest, own = 0.0, {}
  for step in sorted(set(one) & set(reordered)):
    largest = max(largest, digests.step_difference(one[step], reordered[step],
                                                   float("inf"))[1])
    own[step] = largest
  return own


def judge_own_rounding(check: Check, one: dict, other: dict, steps, own: dict) -> None:
  """`check` (which exceeded ROUNDING_PER_STEP) judged again against the job's own rounding
  (`own_rounding`): OWN_ROUNDING_FACTOR times it at each step, never below the fixed bound.
  A reordered run equal to the first bit for bit measured nothing: the verdict stands."""
  if not any(own.values()):
    check.note += (" (the 1-replica run in another summation order was the same bit for "
                   "bit: the job's own rounding could not be measured)")
    return

  def bound(step: int) -> float:
    return max(ROUNDING_PER_STEP * step, OWN_ROUNDING_FACTOR * own.get(step, 0.0))
  check.bound, check.holds = OWN_ROUNDING, None
  check.first_step = check.first_variable = None
  check.tolerance = max(bound(step) for step in steps)
  check.note += (f"; above {ROUNDING_PER_STEP:.0e} per step, so judged against the job's "
                 f"own: its 1-replica run in another summation order parts by up to "
                 f"{max(own.values()):.1e}, bound {OWN_ROUNDING_FACTOR:g}x that at each step")
  judge_digests(check, one, other, steps, bound)
