"""Host decisions every synchronous worker must share: stop now? save now? restore which step?

Under MultiWorkerMirroredStrategy every worker runs the same loop. A decision
taken from local state (a signal received, a wall clock, a list of checkpoint
steps, a checkpoint readable) could differ between workers and leave one waiting
in a collective the others never join. `Agreement` turns local values into the
same answer everywhere with one tiny all-reduce, compiled once (eager collectives
are slow and warn). Every worker must call it at the same points, as often as the
others: a decision that decides whether to call it again must itself be agreed.

It is on whenever the synchronous cluster has more than one task (a `chief` and
one `worker`, as a Kubeflow TFJob starts them, are two). A single process, or a
parameter-server coordinator (the only process that decides), needs no collective.
"""
import time

import tensorflow as tf

from trainer.cluster import runtime

# After the run's last agreement, how long a worker stays for its peers to read its part (a
# few bytes; the wait covers a peer's thread being late on a loaded machine).
_LAST_PART_READ_SEC = 0.5


class Agreement:

  def __init__(self, strategy: tf.distribute.Strategy):
    self._is_chief = runtime.is_chief(strategy)
    self._sum = None
    if (isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)
        and runtime.num_workers(strategy) > 1):
      local_replicas = len(strategy.extended.worker_devices)  # the same on every worker

      @tf.function
      def sum_over_workers(values):
        # A collective: every worker must call it at the same point of the loop.
        # Each of a worker's replicas adds its values: divide to count each worker once.
        per_replica = strategy.run(lambda local: local, args=(values,))
        total = strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)
        return total / local_replicas

      self._sum = sum_over_workers

  def share(self, *, any_of: bool = False, chiefs: float = 0.0) -> tuple[bool, float]:
    """One collective: (is `any_of` true on some worker, the chief's `chiefs` everywhere).

    `chiefs` must be exact in float64 (integers up to 2**53: steps are).
    """
    if self._sum is None:
      return any_of, chiefs
    local = tf.constant([1.0 if any_of else 0.0, chiefs if self._is_chief else 0.0],
                        tf.float64)
    count, value = self._sum(local).numpy().tolist()
    return count > 0, value

  def any_of_each(self, flags: list[bool]) -> list[bool]:
    """For each flag: true everywhere if true on any worker (one collective)."""
    if self._sum is None:
      return list(flags)
    local = tf.constant([1.0 if flag else 0.0 for flag in flags], tf.float64)
    return [value > 0 for value in self._sum(local).numpy().tolist()]

  def at_the_end(self) -> None:
    """Every worker is past the run's last collective before any leaves. TensorFlow's
    collectives pull a worker's part from it, so a worker whose op is done may still be
    read from: one that exited at once (the CLI leaves by os._exit) left the chief's final
    eval reduce without its part ("Socket closed"), and the launcher restarted the group
    (seen on a loaded 2-core machine). After this agreement every earlier collective is
    done everywhere; the short wait lets the peers read this one's part too."""
    if self._sum is None:
      return
    self.share()
    time.sleep(_LAST_PART_READ_SEC)

  def any(self, local: bool) -> bool:
    """True everywhere if it is true on any worker."""
    return self.share(any_of=local)[0]

  def all(self, local: bool) -> bool:
    """True everywhere if it is true on every worker."""
    return not self.any(not local)

  def chiefs(self, value: int) -> int:
    """The chief's `value` (an integer), on every worker."""
    return int(self.share(chiefs=float(value))[1])
