"""Test-only pause points, so a test can signal or fill the disk at a known phase.

`DISTLOOP_TEST_HOLD=PHASE` makes `hold(PHASE)` log `test hold at PHASE` and wait
until the file `DISTLOOP_TEST_HOLD_FILE` exists. Unset (always, outside tests),
`hold` returns at once. Phases: restore (after it, before the first agreed stop
check), eval (at the start of an eval), export (inside the export, before the
SavedModel is written), summary (before summary.json is written).
"""
import os
import time

from absl import logging

_POLL_SECONDS = 0.05


def hold(phase: str) -> None:
  if os.environ.get("DISTLOOP_TEST_HOLD") != phase:
    return
  path = os.environ["DISTLOOP_TEST_HOLD_FILE"]
  logging.info("test hold at %s until %s exists", phase, path)
  while not os.path.exists(path):
    time.sleep(_POLL_SECONDS)
