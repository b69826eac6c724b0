"""Per-variable digests at each loop boundary: where two runs of one job first part.

With DISTLOOP_DIGESTS=1 in its environment (`requested()`), a training process adds
`recorder()`: at every loop boundary the chief appends one JSON line to
`MODEL_DIR/verify/digests.jsonl`, the step and, for each variable a checkpoint holds
(keyed as the checkpoint keys it: `model/...`, `optimizer/...`), the SHA-256 of its
bytes and a fixed sample of its values. The user's config and actions stay as they are.
`python -m trainer.verify` runs every process of a job so, with one step per loop, so
the first step and variable where two runs differ are read here, not guessed from the
end: equal digests mean bit for bit; the samples say by how much two runs on other
replica counts differ at each step. A step trained again after a resume (a SIGKILL's lost
steps) is recorded again; the last record of a step is the one that counts.
"""
import hashlib
import json
import os

import numpy as np

from trainer.loop.actions import Action

ENV = "DISTLOOP_DIGESTS"
FILE = os.path.join("verify", "digests.jsonl")
SAMPLE = 64  # values of each variable kept per step, evenly spaced over its elements


def requested() -> list[Action]:
  """[the recorder] if this process's environment asks for digests, else []."""
  return [Action(_append, every_boundary=True, name="verify digests")] if os.environ.get(
      ENV, "") not in ("", "0") else []


def of_state(state) -> dict:
  """{checkpoint key: {"sha256", "sample"}} of a TaskState's variables."""
  keyed = {**{f"model/{key}": variable for key, variable in state.model_variables.items()},
           **{f"optimizer/{key}": variable
              for key, variable in state.optimizer_variables.items()}}
  return {key: of_array(np.asarray(variable.numpy())) for key, variable in keyed.items()}


def of_array(values: np.ndarray) -> dict:
  flat = values.reshape(-1)
  picked = flat[np.linspace(0, flat.size - 1, min(SAMPLE, flat.size)).astype(np.int64)] \
      if flat.size else flat
  sample = [float(v) for v in picked.astype(np.float64)] if values.dtype.kind in "fiub" else []
  return {"sha256": hashlib.sha256(np.ascontiguousarray(values).tobytes()).hexdigest()[:32],
          "sample": sample}


def _append(boundary) -> None:
  if not boundary.is_chief or boundary.state is None or "://" in boundary.model_dir:
    return
  path = os.path.join(boundary.model_dir, FILE)
  os.makedirs(os.path.dirname(path), exist_ok=True)
  line = json.dumps({"step": boundary.step, "variables": of_state(boundary.state)})
  with open(path, "a") as f:
    f.write(line + "\n")


def read(model_dir) -> dict:
  """{step: {key: {"sha256", "sample"}}}: the last record of each step (a line cut short by
  a SIGKILL is skipped: its step is recorded again by the process that resumes)."""
  steps = {}
  try:
    with open(os.path.join(str(model_dir), FILE)) as f:
      lines = f.readlines()
  except OSError:
    return steps
  for line in lines:
    try:
      entry = json.loads(line)
    except ValueError:
      continue
    steps[int(entry["step"])] = entry["variables"]
  return steps


def first_difference(reference: dict, other: dict, steps, tolerance: float = 0.0):
  """(step, key, difference) of the first step of `steps` (in order) where a variable of
  `other` differs from `reference` by more than `tolerance` (0.0: any bit, by digest;
  else by the largest difference of the samples), the first such key in checkpoint order;
  None if none does. A step either run lacks is a difference of the whole step (key
  None, difference inf)."""
  for step in sorted(steps):
    if step not in reference or step not in other:
      return step, None, float("inf")
    ours, theirs = reference[step], other[step]
    if ours.keys() != theirs.keys():
      missing = sorted(ours.keys() ^ theirs.keys())
      return step, missing[0], float("inf")
    for key in ours:
      if tolerance == 0.0 and ours[key]["sha256"] == theirs[key]["sha256"]:
        continue
      difference = sample_difference(ours[key], theirs[key])
      if tolerance == 0.0 and difference == 0.0:
        difference = float("nan")  # other bits, equal samples: somewhere unsampled
      if not difference <= tolerance:
        return step, key, difference
  return None


def sample_difference(ours: dict, theirs: dict) -> float:
  a, b = np.asarray(ours["sample"], np.float64), np.asarray(theirs["sample"], np.float64)
  if a.shape != b.shape:
    return float("inf")
  return float(np.max(np.abs(a - b))) if a.size else 0.0
