"""Periodic work asked "is it time?" with the step (or a clock): *when*, kept apart from *what*."""
import time
from typing import Callable


class Every:
  """Due at every multiple of `interval` and at `last_step`; `interval=0` means only at the end."""

  def __init__(self, interval: int, last_step: int):
    self.interval = interval
    self.last_step = last_step

  def due(self, step: int) -> bool:
    return step == self.last_step or (self.interval > 0 and step % self.interval == 0)

  def next_due(self, step: int) -> int:
    """The first step after `step` at which this is due."""
    if self.interval <= 0:
      return self.last_step
    return min((step // self.interval + 1) * self.interval, self.last_step)


class AfterSeconds:
  """Due once `interval` seconds have passed since the last `restart()`; `interval=0`: never.

  The clock is passed in (a test moves it instead of sleeping). With several workers
  only the chief's answer counts: wall clocks differ between machines.
  """

  def __init__(self, interval: float, clock: Callable[[], float] = time.monotonic):
    self.interval = interval
    self._clock = clock
    self._since = clock()

  def due(self) -> bool:
    return self.interval > 0 and self._clock() - self._since >= self.interval

  def restart(self) -> None:
    self._since = self._clock()
