"""Plug-ins and a config that never return (used by test_start_up_signals.py). Each says
`hung plug-in: NAME` on stdout first (start-up hides stderr for a while), so the test signals it once it is there."""
import threading
import time

import ml_collections


def _say(name: str) -> None:
  print(f"hung plug-in: {name}", flush=True)


def get_config():
  """--config=tests/plugins/hung_plugins.py: a config file whose get_config blocks (sleeping)."""
  _say("get_config")
  while True:
    time.sleep(1)
  return ml_collections.ConfigDict()  # pylint: disable=unreachable


def data(data_config, seed):
  """data.name: waits on an Event that nothing sets."""
  _say("data")
  threading.Event().wait()


def model(model_config, input_spec):
  """model.name: sleeps forever."""
  _say("model")
  while True:
    time.sleep(1)


def stubborn_model(model_config, input_spec):
  """model.name: swallows whatever interrupts it, as code stuck in C would: only the
  watchdog can end it."""
  _say("stubborn_model")
  while True:
    try:
      time.sleep(1)
    except BaseException:  # pylint: disable=broad-except
      pass
