"""Host decisions every synchronous worker must share: stop now? restore this step?

Under MultiWorkerMirroredStrategy every worker runs the same loop. A decision
taken from local state (a signal received, a checkpoint readable) could differ
between workers and leave one waiting in a collective the others never join.
`Agreement` turns a local yes/no into the same answer everywhere with one tiny
all-reduce, compiled once (eager collectives are slow and warn). A single
process, or a parameter-server coordinator (the only process that decides),
needs no collective.
"""
import tensorflow as tf


class Agreement:

  def __init__(self, strategy: tf.distribute.Strategy):
    self._count_true = None
    resolver = getattr(strategy, "cluster_resolver", None)
    if (isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy) and resolver is not None
        and len(resolver.cluster_spec().as_dict().get("worker", [])) > 1):

      @tf.function
      def count_true(flag):
        # A collective: every worker must call it at the same point of the loop.
        per_replica = strategy.run(lambda value: value, args=(flag,))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

      self._count_true = count_true

  def any(self, local: bool) -> bool:
    """True everywhere if it is true on any worker."""
    if self._count_true is None:
      return local
    return float(self._count_true(tf.constant(1.0 if local else 0.0))) > 0

  def all(self, local: bool) -> bool:
    """True everywhere if it is true on every worker."""
    return not self.any(not local)
