"""A test's pause points, made of Actions (train.actions): signal or fill the disk at a phase.

`--config.train.actions=tests/plugins/hold_actions.py:hold` with DISTLOOP_TEST_HOLD=PHASE
(restored, eval, export, summary) and DISTLOOP_TEST_HOLD_FILE=PATH: at PHASE the
action logs `test hold at PHASE` and waits until PATH exists.
"""
import os
import time

from absl import logging

import trainer

_POLL_SECONDS = 0.05


def hold(config):
  del config
  phase, path = os.environ["DISTLOOP_TEST_HOLD"], os.environ["DISTLOOP_TEST_HOLD_FILE"]

  def wait(boundary):
    del boundary
    logging.info("test hold at %s until %s exists", phase, path)
    while not os.path.exists(path):
      time.sleep(_POLL_SECONDS)

  return trainer.Action(wait, phase=phase, name=f"hold_at_{phase}")
