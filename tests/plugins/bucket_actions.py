"""A pause point for tests of a bucket model_dir (tests/buckets/test_bucket_model_dir.py), made of
an Action (train.actions): `--config.train.actions=tests/plugins/bucket_actions.py:wait_at` with
DISTLOOP_TEST_WAIT_AT=STEP and DISTLOOP_TEST_GO=PATH: at the boundary of STEP (before
its checkpoint, after the previous one was saved) it logs `test waiting at step STEP`
and waits until PATH exists (5 minutes at most). Without those variables it does nothing
(a resumed run of the same config)."""
import os
import time

from absl import logging

import trainer


def wait_at(config):
  del config
  step, go = os.environ.get("DISTLOOP_TEST_WAIT_AT"), os.environ.get("DISTLOOP_TEST_GO")

  def wait(boundary):
    if step is None or boundary.step != int(step):
      return
    logging.info("test waiting at step %d until %s exists", boundary.step, go)
    deadline = time.monotonic() + 300
    while not os.path.exists(go) and time.monotonic() < deadline:
      time.sleep(0.05)

  return trainer.Action(wait, every_steps=10, name="wait_at")
