"""Periodic work asked "is it time?" with the step: *when*, kept apart from *what*."""


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
