"""trainer/cluster/peers.py: which errors of a multi-worker run mean "a peer is gone" (one
line, exit 1) and which keep their own report. The run itself: tests/cluster/test_multi_worker.py
(a worker SIGKILLed under trainer.launch)."""
import pytest
import tensorflow as tf

from trainer.cluster import peers

# What the survivor's train loop raised when worker-1 was SIGKILLed (TF 2.21), shortened.
_SOCKET_CLOSED = (
    "Graph execution error:\n\nDetected at node while/CollectiveReduceV2 defined at (most "
    "recent call last):\n  File \"<frozen runpy>\", line 198, in _run_module_as_main\n\n"
    "Collective ops is aborted by: Socket closed\nAdditional GRPC error information from "
    "remote target /job:worker/replica:0/task:1 while calling /tensorflow.WorkerService/"
    "RecvBuf:\n:UNKNOWN:Error received from peer  {grpc_message:\"Socket closed\", "
    "grpc_status:14}\nThe error could be from a previous operation. Restart your program "
    "to reset.\n\t [[{{node while/CollectiveReduceV2}}]] [Op:__inference_train_loop_1661]")


@pytest.mark.parametrize("error, line", [
    (tf.errors.UnavailableError(None, None, _SOCKET_CLOSED),
     "Collective ops is aborted by: Socket closed"),
    (tf.errors.InternalError(None, None, "Graph execution error:\nSocket closed"), "Socket closed"),
    (tf.errors.CancelledError(None, None, "[_Derived_]Collective ops is aborted by: Connection "
                              "reset by peer"),
     "[_Derived_]Collective ops is aborted by: Connection reset by peer"),
    # Not a peer's loss: a file system's outage, a user's op, an error of Python's.
    (tf.errors.UnavailableError(None, None, "GCS: service unavailable, retry later"), None),
    (tf.errors.InvalidArgumentError(None, None, "Socket closed"), None),
    (tf.errors.InternalError(None, None, "Graph execution error:\nBlas GEMM launch failed"),
     None),
    (ValueError("Socket closed"), None),
], ids=["unavailable-socket-closed", "internal-socket-closed", "cancelled-connection-reset",
        "unavailable-storage", "invalid-argument", "internal-other", "python"])
def test_only_a_collective_failed_on_a_peer_is_a_peer_loss(error, line):
  assert peers.peer_loss_line(error) == line


def test_one_line_in_a_multi_worker_run_nothing_in_one_process(monkeypatch):
  """Catches: the survivor's 55-line traceback; and one line that would hide a single
  process's own failure."""
  error = tf.errors.UnavailableError(None, None, _SOCKET_CLOSED)
  assert peers.lost(tf.distribute.get_strategy(), error, step=30) is None
  # A MultiWorkerMirroredStrategy of 2 workers, as far as peers.lost looks.
  two_workers = object.__new__(tf.distribute.MultiWorkerMirroredStrategy)
  monkeypatch.setattr(peers.runtime, "num_workers", lambda strategy: 2)
  assert str(peers.lost(two_workers, error, step=30)) == (
      "lost a peer worker at step 30 (UnavailableError: Collective ops is aborted by: Socket "
      "closed): the launcher or the cluster restarts the group from the latest checkpoint")
  monkeypatch.setattr(peers.runtime, "num_workers", lambda strategy: 1)
  assert peers.lost(two_workers, error, step=30) is None
