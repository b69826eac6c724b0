"""verify's judges on digests written here, in-process, no training: a bound as verify's
report states it, not looser (a resume check that let one ulp through would still print
"bit for bit")."""
import json
import os

import numpy as np
import pytest

from trainer.loop import digests
from trainer.verify import checks, report

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
  judged = checks.judge_chain(str(reference), str(chain), stopped=3, restored=5, last=STEPS,
                              killed="after step 6")
  found = {check.name: check for check in judged}
  assert list(found) == ["repeat", "sigterm", "sigkill"]
  check = found[parted]
  assert check.holds is False, report.table(judged)
  assert (check.first_step, check.first_variable) == (step, KEY), report.table(judged)
  assert 0.0 < check.largest < 1e-6
  assert (check.bound, check.tolerance) == (checks.BIT_FOR_BIT, 0.0)
  earlier = judged[:judged.index(check)]
  assert all(other.holds for other in earlier), report.table(judged)
  assert all(other.holds is None for other in judged[judged.index(check) + 1:])
  assert f"{parted}: first differs at step {step}, variable {KEY}" in report.table(judged)
