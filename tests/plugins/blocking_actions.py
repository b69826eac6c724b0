"""Actions that never return (train.actions), for tests/loop/test_liveness.py.

`block_at_20`: at step 20 it logs `blocking at step 20` and waits on a lock nobody
releases (a user's callback stuck on a lock; time.sleep(1000) is the same to the
trainer). `block_on_worker_1_at_20`: the same on the second worker only.
"""
import threading

from absl import logging

import trainer

_STUCK = threading.Lock()


def _block(boundary):
  logging.info("blocking at step %d", boundary.step)
  _STUCK.acquire()
  _STUCK.acquire()  # never returns


def block_at_20(config):
  del config
  return trainer.Action(lambda boundary: _block(boundary) if boundary.step == 20 else None,
                        every_steps=10, name="block_at_20")


def block_on_worker_1_at_20(config):
  del config

  def maybe_block(boundary):
    if boundary.step == 20 and not boundary.is_chief:
      _block(boundary)

  return trainer.Action(maybe_block, every_steps=10, name="block_on_worker_1_at_20")


def slow_exit(config):
  """What the interpreter's teardown waited on after the last write (tf.data's iterators
  on a busy machine, 20-80 s: issue 31), made certain: 120 s at exit."""
  del config
  import atexit  # pylint: disable=g-import-not-at-top
  import time  # pylint: disable=g-import-not-at-top
  atexit.register(time.sleep, 120)
  return trainer.Action(lambda boundary: None, at_end=True, name="slow_exit")
