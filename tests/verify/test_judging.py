"""verify's judges on digests written here, in-process, no training: a bound as verify's
report states it, not looser (a resume check that let one ulp through would still print
"bit for bit")."""
import json
import os

import numpy as np
import pytest

from trainer.loop import digests
from trainer.verify import judging, report

KEY = "model/tiny/logits/kernel"
STEPS = 8


def _write_digests(model_dir, nudged_step: int | None = None) -> None:
  """Digests of STEPS steps of one small variable; at `nudged_step` one value is moved
  by one ulp (the smallest difference a summation order makes)."""
  path = os.path.join(str(model_dir), digests.FILE)
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "w") as f:
    for step in range(1, STEPS + 1):
      values = np.linspace(-1.0, 1.0, 32, dtype=np.float32) * step
      if step == nudged_step:
        values[7] = np.nextafter(values[7], np.float32(np.inf))
      f.write(json.dumps({"step": step, "variables": {
          KEY: digests.of_array(values), "optimizer/iterations": digests.of_array(
              np.asarray(step, np.int64))}}) + "\n")


@pytest.mark.parametrize("step, parted", [(2, "repeat"), (4, "sigterm"), (6, "sigkill")])
def test_a_resume_that_parts_by_one_ulp_differs_bit_for_bit(tmp_path, step, parted):
  """The chain's segments (SIGTERM saved step 3, the SIGKILL's run resumed from 5) against
  the reference: one ulp at `step` is a difference of the segment holding it, named at
  its step and variable, and the segments after it are not judged."""
  reference, chain = tmp_path / "reference", tmp_path / "chain"
  _write_digests(reference)
  _write_digests(chain, nudged_step=step)
  judged = judging.judge_chain(str(reference), str(chain), stopped=3, restored=5,
                               last=STEPS, killed="after step 6")
  found = {check.name: check for check in judged}
  assert list(found) == ["repeat", "sigterm", "sigkill"]
  check = found[parted]
  assert check.holds is False, report.table(judged)
  assert (check.first_step, check.first_variable) == (step, KEY), report.table(judged)
  assert 0.0 < check.largest < 1e-6
  assert (check.bound, check.tolerance) == (judging.BIT_FOR_BIT, 0.0)
  earlier = judged[:judged.index(check)]
  assert all(other.holds for other in earlier), report.table(judged)
  assert all(other.holds is None for other in judged[judged.index(check) + 1:])
  assert f"{parted}: first differs at step {step}, variable {KEY}" in report.table(judged)


def _trajectory(moved_by) -> dict:
  """{step: digests} of a variable whose values at `step` are moved by `moved_by(step)`
  from a fixed trajectory."""
  return {step: {KEY: digests.of_array(
      (np.linspace(-1.0, 1.0, 32) * step + moved_by(step)).astype(np.float32))}
      for step in range(1, STEPS + 1)}


def _failing_shapes_check(one, other) -> judging.Check:
  check = judging.Check("shapes 2", judging.ROUNDING,
                        tolerance=judging.ROUNDING_PER_STEP * STEPS)
  judging.judge_digests(check, one, other, range(1, STEPS + 1),
                        lambda step: judging.ROUNDING_PER_STEP * step)
  return check


@pytest.mark.parametrize("another_count, holds", [
    (lambda step: 3e-7 * 4 ** step, True),    # rounding a sensitive job carries along
    (lambda step: 1e-3 * step, False),        # a gradient counted twice: step 1 already
], ids=["sensitive_job", "gradient_counted_twice"])
def test_a_job_more_sensitive_to_the_summation_order_is_judged_by_its_own_rounding(
    another_count, holds):
  """A job whose 1-replica run in another summation order parts by 1e-7 x 4^step (a
  contrastive loss at a high rate) is beyond ROUNDING_PER_STEP on 2 replicas, and within
  10x its own rounding: it holds, the report saying the bound is the job's own. A
  gradient counted twice exceeds that at step 1 and still differs there."""
  one = _trajectory(lambda step: 0.0)
  reordered = _trajectory(lambda step: 1e-7 * 4 ** step)
  other = _trajectory(another_count)
  check = _failing_shapes_check(one, other)
  assert check.holds is False
  judging.judge_own_rounding(check, one, other, range(1, STEPS + 1),
                             judging.own_rounding(one, reordered))
  assert check.holds is holds, report.table([check])
  assert check.bound == judging.OWN_ROUNDING == "the job's own rounding"
  assert "another summation order" in check.note
  if holds:
    assert check.largest > judging.ROUNDING_PER_STEP * STEPS  # beyond the fixed bound
  else:
    assert (check.first_step, check.first_variable) == (1, KEY)


def test_an_unmeasurable_own_rounding_leaves_the_verdict():
  """A reordered run equal bit for bit (no other order on this machine) measures nothing:
  the fixed bound's verdict stands, and the report says why."""
  one = _trajectory(lambda step: 0.0)
  check = _failing_shapes_check(one, _trajectory(lambda step: 1e-5))
  judging.judge_own_rounding(check, one, _trajectory(lambda step: 1e-5),
                             range(1, STEPS + 1), judging.own_rounding(one, one))
  assert (check.holds, check.bound, check.first_step) == (False, judging.ROUNDING, 1)
  assert "could not be measured" in check.note
