"""--mode=predict's test data: sources read by row that signal their own process when they
read a chosen row of the eval split, so a stop (SIGTERM) or a kill (SIGKILL) lands at a chosen moment of the
scoring, passed in rather than slept for:

  PREDICT_SIGNAL=TERM|KILL   PREDICT_SIGNAL_ROW=<row>   PREDICT_SIGNAL_ONCE=<a path>

The signal is sent once (the path is made first: a rerun reads on). Each read also takes
PREDICT_READ_SECONDS (default 0; the eval split's), so the rows read ahead of the scoring stay few.
PREDICT_CHANGED_ROWS=<row>,<row>...: those eval rows' features are other values (the data
rewritten between two runs, the same count of rows).
"""
import os
import signal
import time

import numpy as np


class Signalling:
  """A random-access source (`__len__`, `__getitem__(rows)`) over in-memory arrays."""

  def __init__(self, features, labels, signals: bool = False):
    self.features, self.labels, self.signals = features, labels, signals

  def __len__(self):
    return len(self.labels)

  def __getitem__(self, rows):
    rows = np.asarray(rows)
    if self.signals:
      time.sleep(float(os.environ.get("PREDICT_READ_SECONDS", "0")))
      _signal_if_read(rows)
    return self.features[rows], self.labels[rows]


def _signal_if_read(rows) -> None:
  row, once = os.environ.get("PREDICT_SIGNAL_ROW"), os.environ.get("PREDICT_SIGNAL_ONCE")
  if row is None or int(row) not in rows or not once:
    return
  try:
    with open(once, "x"):
      pass
  except FileExistsError:
    return
  os.kill(os.getpid(), getattr(signal, f"SIG{os.environ['PREDICT_SIGNAL']}"))


def images(data_config, seed):
  """data.name='synthetic''s images and labels, float32 [N, 28, 28, 1] in [0, 1]."""
  from input_pipelines.datasets import synthetic  # pylint: disable=import-outside-toplevel
  splits = synthetic.build(data_config, seed)
  as_floats = lambda images: (images.astype(np.float32) / 255.0)[..., None]  # pylint: disable=unnecessary-lambda-assignment
  evaluated = as_floats(splits.test_images)
  changed = [int(row) for row in os.environ.get("PREDICT_CHANGED_ROWS", "").split(",") if row]
  evaluated[changed] = 1.0 - evaluated[changed]
  return (Signalling(as_floats(splits.train_images), splits.train_labels),
          Signalling(evaluated, splits.test_labels, signals=True))


def gan_mixture(data_config, seed):
  """examples/gan.py's mixture, read by row."""
  from examples import gan  # pylint: disable=import-outside-toplevel
  train, evaluated = gan.mixture(data_config, seed)
  return Signalling(*train), Signalling(*evaluated, signals=True)
