"""runtime.profile_steps=START,END: a tf.profiler trace of steps START+1..END.

TensorBoard's profile plugin (`pip install tensorboard-plugin-profile`) shows the trace.
Like every periodic action it works at loop boundaries: the loop asks for the next
boundary so that the window starts and ends exactly at START and END, and inside the
window it runs one step per loop, each call traced with a step marker (`step`), so that
the profile's overview and step-time pages show each step ("No step marker observed"
without it). The step count is an argument of the compiled loop: the same steps, the
same weights, a row of logs per step in the window.

Every worker of a synchronous cluster cuts its loops at those edges and steps (the
loops' collectives must pair up); only the chief (`trace=True`) records, into
model_dir/tensorboard/plugins/profile/<run>/. Not every worker: on a non-chief worker
of a multi_worker_mirrored cluster, TF 2.21's profiler corrupts memory as it stops
(TraceMeRecorder::Consume merging the events that a collective starts on one thread and
ends on another: about 1 run in 5 died there, measured 2026-12-07), so distloop does
not offer it. `ProfileAction` is the window as one of the built-in Actions.
"""
import contextlib
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
    """The next boundary the window needs after `step` (each step inside it), or None."""
    if self._window is None:
      return None
    start, end = self._window
    if start <= step < end:
      return step + 1
    return start if step < start else None

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

  def step(self, step_num: int):
    """Around the loop that runs step `step_num` alone: its step marker in the trace (a
    root event named "train" with a step_num), what TensorBoard's step pages group by.
    Nothing outside the window (a rollback from inside it runs longer loops before it)."""
    if not self._active or not self._window[0] < step_num <= self._window[1]:
      return contextlib.nullcontext()
    return tf.profiler.experimental.Trace("train", step_num=step_num, _r=1)

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
