"""Graceful preemption: SIGTERM or SIGINT asks the run to stop at the next loop boundary.

The handler only sets a flag; nothing unsafe runs inside it. At every loop
boundary the loop agrees on `requested` (in the all-reduce that also carries the
chief's save-by-clock decision; `stop_agreed()` asks alone). With several workers
the flag is all-reduced, so all of them get the same answer at the same boundary
and stop at the same step: none is left waiting in a collective the others never join.
The loop then saves that step, waits for the write and exits 42. A second
signal while that happens changes nothing.
"""
import signal
import threading

from absl import logging

from trainer.agreement import Agreement

_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class PreemptionWatcher:
  """Context manager: installs the handlers on entry and restores the old ones on exit."""

  def __init__(self, agreement: Agreement):
    self._agreement = agreement
    self._requested = threading.Event()
    self._previous = {}

  def __enter__(self) -> "PreemptionWatcher":
    if threading.current_thread() is threading.main_thread():
      for signum in _SIGNALS:
        self._previous[signum] = signal.signal(signum, self._handle)
    return self

  def __exit__(self, *exc_info) -> None:
    for signum, handler in self._previous.items():
      signal.signal(signum, handler)
    self._previous = {}

  def _handle(self, signum, frame) -> None:
    del frame
    name = signal.Signals(signum).name
    if self._requested.is_set():
      logging.warning("%s again: already stopping at the next loop boundary", name)
    else:
      logging.warning("%s: saving a checkpoint at the next loop boundary, then exiting 42", name)
    self._requested.set()

  @property
  def requested(self) -> bool:
    """A signal reached this process (its own view: agree on it before acting)."""
    return self._requested.is_set()

  def stop_agreed(self) -> bool:
    """Every worker calls this at every loop boundary; True on all of them or none."""
    return self._agreement.any(self._requested.is_set())
