"""A multi-worker run's collective that failed because a peer process is gone.

Under MultiWorkerMirroredStrategy a worker that is killed or crashes closes its
sockets, and every other worker's next collective fails on it within milliseconds
(`UnavailableError: ... Collective ops is aborted by: Socket closed`, a 55-line
traceback). That failure is not the survivor's: it is one line (errors.PeerLost), and
the launcher or the cluster restarts the group from the latest checkpoint. Only these
errors in a run of several workers: an op that fails for a reason of its own (bad data,
a user's assertion, a storage error, a single process's) keeps its own report.
"""
import re

import tensorflow as tf

from trainer.cluster import runtime
from trainer.errors import PEER_LOST, PeerLost

# The statuses gRPC and the collective executor give a peer's loss; with one of the lines
# below in the message (an UnavailableError from a file system is no peer's loss).
_PEER_LOSS_TYPES = (tf.errors.UnavailableError, tf.errors.CancelledError,
                    tf.errors.AbortedError, tf.errors.InternalError, tf.errors.UnknownError)
_PEER_LOSS_LINE = re.compile(
    r"collective ops is aborted|socket closed|connection (?:reset|refused|closed|aborted)"
    r"|failed to connect|error received from peer|grpc_status", re.IGNORECASE)


def peer_loss_line(error: BaseException) -> str | None:
  """The line of `error` that says a peer is gone ("Collective ops is aborted by: Socket
  closed"), or None when it is no peer's loss."""
  if not isinstance(error, _PEER_LOSS_TYPES):
    return None
  lines = [line.strip() for line in str(getattr(error, "message", error)).splitlines()]
  return next((line[:200] for line in lines if _PEER_LOSS_LINE.search(line)), None)


def lost(strategy: tf.distribute.Strategy, error: BaseException,
         step: int | None) -> PeerLost | None:
  """`error` as the one line of a worker that lost a peer at `step` (None: before its
  first loop of steps ended), or None when it is something else or the run has one worker."""
  if not (isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)
          and runtime.num_workers(strategy) > 1):
    return None
  line = peer_loss_line(error)
  if line is None:
    return None
  when = f"at step {step}" if step is not None else "before its first loop of steps ended"
  return PeerLost(f"{PEER_LOST} {when} ({type(error).__name__}: {line}): the launcher or the "
                  f"cluster restarts the group from the latest checkpoint")
