"""Per-variable digests at each loop boundary: where two runs of one job first part.

With DISTLOOP_DIGESTS=1 in its environment, a training process adds the Action
`requested()` returns: at every loop boundary the chief appends one JSON line to
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
from trainer.state import keys
from trainer.store import files

ENV = "DISTLOOP_DIGESTS"
FILE = os.path.join("verify", "digests.jsonl")
SAMPLE = 64  # values of each variable kept per step, evenly spaced over its elements


def requested() -> list[Action]:
  """[the recorder] if this process's environment asks for digests, else []."""
  return [Action(_append, every_boundary=True, name="verify digests")] if os.environ.get(
      ENV, "") not in ("", "0") else []


def of_state(state) -> dict:
  """{checkpoint key: {"sha256", "sample"}} of a TaskState's variables."""
  keyed = keys.as_saved(state.model_variables, state.optimizer_variables)
  return {key: of_array(np.asarray(variable.numpy())) for key, variable in keyed.items()}


def of_array(values: np.ndarray) -> dict:
  flat = values.reshape(-1)
  picked = flat[np.linspace(0, flat.size - 1, min(SAMPLE, flat.size)).astype(np.int64)] \
      if flat.size else flat
  sample = [float(v) for v in picked.astype(np.float64)] if values.dtype.kind in "fiub" else []
  return {"sha256": hashlib.sha256(np.ascontiguousarray(values).tobytes()).hexdigest()[:32],
          "sample": sample}


def _append(boundary) -> None:
  if not boundary.is_chief or boundary.state is None:
    return
  line = json.dumps({"step": boundary.step, "variables": of_state(boundary.state)})
  appender = files.Appender(os.path.join(boundary.model_dir, FILE))
  try:
    appender.write(line + "\n")
  finally:
    appender.close()


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


def step_difference(ours: dict, theirs: dict, tolerance: float) -> tuple[str | None, float]:
  """Two runs' records of one step: (the first key, in checkpoint order, whose variable
  differs by more than `tolerance` (0.0: by any bit, read from the digest), by how much;
  NaN where the bits differ and the samples do not), or (None, the largest difference
  of the samples)."""
  if ours.keys() != theirs.keys():
    return sorted(ours.keys() ^ theirs.keys())[0], float("inf")
  largest = 0.0
  for key in ours:
    difference = sample_difference(ours[key], theirs[key])
    if tolerance == 0.0 and ours[key]["sha256"] != theirs[key]["sha256"]:
      return key, difference or float("nan")
    if not difference <= tolerance:  # NaN too
      return key, difference
    largest = max(largest, difference)
  return None, largest


def sample_difference(ours: dict, theirs: dict) -> float:
  a, b = np.asarray(ours["sample"], np.float64), np.asarray(theirs["sample"], np.float64)
  if a.shape != b.shape:
    return float("inf")
  return float(np.max(np.abs(a - b))) if a.size else 0.0
