"""runtime.profile_steps=START,END: a tf.profiler trace of steps START+1..END.

The trace goes to model_dir/tensorboard/plugins/profile/<run>/, where
TensorBoard's profile plugin (`pip install tensorboard-plugin-profile`) shows it.
Like every periodic action it works at loop boundaries: the loop asks for the
next boundary so that the window starts and ends exactly at START and END.

Every worker of a synchronous cluster cuts its loops at those edges (the loops'
collectives must pair up); only the chief (`trace=True`) records. `ProfileAction`
is the window as one of the built-in Actions.
"""
import os

import tensorflow as tf

from trainer.loop import actions
from trainer.store import files


class ProfileWindow:

  def __init__(self, spec: str, logdir: str, *, trace: bool):
    self._logdir = logdir
    self._window = tuple(int(part) for part in spec.split(",")) if spec else None
    self._trace = trace
    self._active = False

  def next_boundary(self, step: int) -> int | None:
    """The first window edge after `step`, or None."""
    if self._window is None:
      return None
    edges = [edge for edge in self._window if edge > step]
    return min(edges) if edges else None

  def at_boundary(self, step: int) -> None:
    """Starts the trace when `step` enters the window, stops it when it leaves."""
    if self._window is None or not self._trace:
      return
    start, end = self._window
    if not self._active and start <= step < end:
      # the profiler writes its trace under plugins/profile/, a folder the store hands it
      files.library_folder(os.path.join(self._logdir, "plugins", "profile"), "profiler")
      tf.profiler.experimental.start(self._logdir)
      self._active = True
    elif self._active and step >= end:
      self.close()

  def close(self) -> None:
    """Stops a trace still running (the run ended or failed inside the window)."""
    if self._active:
      tf.profiler.experimental.stop()
      self._active = False


class ProfileAction(actions.Action):
  """runtime.profile_steps: the profiler starts and stops at boundaries it asks for."""

  def __init__(self, profiler):
    super().__init__(lambda boundary: profiler.at_boundary(boundary.step), every_boundary=True,
                     name="profile")
    self._profiler = profiler

  def next_step(self, step: int, last_step: int) -> int:
    return self._profiler.next_boundary(step) or last_step
