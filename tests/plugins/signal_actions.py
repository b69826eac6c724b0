"""An Action that signals its own process (train.actions): a stop that lands while a loop
boundary's actions run, the moment a test cannot reach by sending the signal from outside.

`--config.train.actions=tests/plugins/signal_actions.py:sigterm_at_first_boundary`: SIGTERM
at the first loop boundary of the run.
"""
import os
import signal

import trainer


def sigterm_at_first_boundary(config):
  del config
  sent = []

  def send(boundary):
    del boundary
    if not sent:
      sent.append(True)
      os.kill(os.getpid(), signal.SIGTERM)

  return trainer.Action(send, every_boundary=True, name="sigterm_at_first_boundary")
