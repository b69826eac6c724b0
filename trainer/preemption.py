"""Graceful preemption: SIGTERM or SIGINT asks the run to stop at the next safe point.

The handler only sets a process-wide flag; nothing unsafe runs inside it. The
CLI installs it first thing (`install()`, before TensorFlow is imported), so a
signal at any moment, start-up and restore included, is a request, never a bare
signal death. Who reads the flag, and when, is decided per phase:

- start-up of a single process: the CLI checks it between phases and exits 42
  (nothing new to save);
- the training loop: at every loop boundary, in the all-reduce that also carries
  the chief's save-by-clock decision (`Agreement.share`; `stop_agreed()` asks alone).
  With several workers the flag is all-reduced, so all of them get the same
  answer at the same boundary and stop at the same step: none is left waiting
  in a collective the others never join. The loop then saves that step, waits
  for the write and exits 42. Multi-worker start-up defers to the first such
  agreed check (right after the restore) for the same reason;
- after the loop: agreed checks before the final eval and before the export.
  A signal during the export lets it finish (seconds) and the run exits 0.

A second signal while stopping changes nothing. This module imports no
TensorFlow: the CLI imports it before anything heavy.
"""
import signal
import threading

from absl import logging

_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_requested = threading.Event()
_installed = False


def install() -> bool:
  """Routes SIGTERM/SIGINT to the flag for the rest of the process (main thread only;
  False elsewhere). Call it again once TensorFlow's runtime is up: under
  MultiWorkerMirroredStrategy its coordination service installs a SIGTERM handler of
  its own in C++ (the preemption notifier), which would take the signal from us."""
  global _installed
  if threading.current_thread() is not threading.main_thread():
    return False
  for signum in _SIGNALS:
    signal.signal(signum, _handle)
  _installed = True
  return True


def _handle(signum, frame) -> None:
  del frame
  name = signal.Signals(signum).name
  if _requested.is_set():
    logging.warning("%s again: already stopping", name)
  else:
    logging.warning("%s: stopping at the next safe point (a loop boundary, or the end of "
                    "the current phase), then exiting 42", name)
  _requested.set()


def requested() -> bool:
  """True once SIGTERM/SIGINT arrived in this process (a local view: see stop_agreed)."""
  return _requested.is_set()


def sleep(seconds: float) -> None:
  """time.sleep that a signal cuts short (continuous_eval polls with it)."""
  _requested.wait(max(seconds, 0.0))


class PreemptionWatcher:
  """The loop's view of the flag. As a context manager it installs the handlers if
  nobody did (a Trainer driven from Python, not the CLI) and then restores them."""

  def __init__(self, agreement):
    self._agreement = agreement  # trainer.agreement.Agreement
    self._previous = {}

  def __enter__(self) -> "PreemptionWatcher":
    if not _installed and threading.current_thread() is threading.main_thread():
      self._previous = {signum: signal.getsignal(signum) for signum in _SIGNALS}
    install()  # again: the runtime may have taken SIGTERM since (see install)
    return self

  def __exit__(self, *exc_info) -> None:
    global _installed
    for signum, handler in self._previous.items():
      signal.signal(signum, handler)
    if self._previous:
      _installed = False
    self._previous = {}

  def stop_agreed(self) -> bool:
    """Every worker calls this at the same points; True on all of them or none."""
    return self._agreement.any(_requested.is_set())
