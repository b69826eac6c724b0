"""Graceful preemption: SIGTERM, SIGINT or SIGHUP asks the run to stop at a safe point.

SIGHUP (a closed terminal, a dropped ssh session) is a preemption like the others:
the work since the last checkpoint is saved, not lost to a bare signal death. The
CLI installs the handler first thing (`install()`, before TensorFlow is imported),
so a signal at any moment, start-up and restore included, is a request, never a
bare signal death. What the handler does, and who reads the flag when, is per phase:

- start-up (`start_up()` .. `end_start_up()`: config, data and model building, the
  plug-ins): nothing is trained, nothing to save, and a plug-in or a config's
  get_config may block forever. The handler raises Preempted in the main thread
  (Python runs it between bytecodes; it also cuts time.sleep and lock waits
  short) and arms a watchdog that exits 42 with the one line after
  `_WATCHDOG_SECONDS` if the process is stuck in native code and never gets
  there. It ends where stopping must be agreed by all workers: for
  multi_worker_mirrored when the runtime starts (before its collectives), else
  once the Trainer is built, before any checkpoint is read;
- the training loop: the handler only sets a flag (nothing unsafe runs inside
  it), read at every loop boundary, in the all-reduce that also carries the
  chief's save-by-clock decision (`Agreement.share`; `stop_agreed()` asks alone).
  With several workers the flag is all-reduced, so all of them get the same
  answer at the same boundary and stop at the same step: none is left waiting
  in a collective the others never join. The loop then saves that step, waits
  for the write and exits 42. Multi-worker start-up after the runtime starts
  defers to the first such agreed check (right after the restore);
- user code at a boundary (an Action) runs in a thread of its own while the main
  thread watches the flag (`bounded`): one that has not
  returned a few seconds after the signal is left running, the boundary's step is
  saved (one process) and the run exits 42, as a hung plug-in at start-up does. One
  that raises KeyboardInterrupt sets the flag (`request`): a stop as on SIGINT, agreed
  right after the boundary's actions, that step saved;
- after the loop: agreed checks before the final eval and before the export.
  A signal during the export lets it finish (seconds) and the run exits 0.

A second signal while stopping changes nothing. This module imports no
TensorFlow: the CLI imports it before anything heavy.
"""
import contextlib
import os
import signal
import threading
import time
from typing import Callable

from absl import logging

from trainer import errors
from trainer.errors import Preempted

_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
_WATCHDOG_SECONDS = 5.0  # a start-up signal ends the process within this, stuck or not
_requested = threading.Event()
_reported = threading.Event()  # the run's one line about the stop is out
_installed = False
_start_up = False  # a first signal arms the watchdog
_interrupt = False  # ... and raises Preempted in the main thread
_first_signal = ""  # its name, for the one line
_before_forced_exit = []  # what the watchdog undoes first (the writer lock of a fresh model_dir)
_previous_handlers = {}  # signal -> the handler install() replaced


def install(*, start_up: bool = False) -> bool:
  """Routes SIGTERM/SIGINT/SIGHUP to the handler until `uninstall()` (main thread only;
  False elsewhere). `start_up`: the CLI's first call, before anything else (see
  `start_up()`). The Python API installs it only when asked (handle_signals=True)."""
  global _installed, _start_up
  if threading.current_thread() is not threading.main_thread():
    return False
  for signum in _SIGNALS:
    previous = signal.signal(signum, _handle)
    if previous is not _handle:
      _previous_handlers[signum] = previous
  _installed = True
  _start_up = _start_up or start_up
  return True


def reinstall() -> None:
  """Takes the signals back if installed: under MultiWorkerMirroredStrategy TensorFlow's
  coordination service installs a SIGTERM handler of its own in C++ (the preemption
  notifier) when the runtime starts, which would take the signal from us."""
  if _installed:
    install()


def uninstall() -> None:
  """Gives the signals back to the handlers before install(), and forgets a request."""
  global _installed
  if threading.current_thread() is not threading.main_thread():
    return
  for signum, handler in _previous_handlers.items():
    signal.signal(signum, handler)
  _previous_handlers.clear()
  _installed = False
  clear()


def clear() -> None:
  """Forgets a stop request (a new run in the same process starts unrequested)."""
  global _first_signal
  _requested.clear()
  _reported.clear()
  _first_signal = ""


def start_up() -> None:
  """From here to `end_start_up()` a signal raises Preempted where the main thread is
  (a signal already received raises it now)."""
  global _start_up, _interrupt
  _start_up = _interrupt = True
  if _requested.is_set():
    raise Preempted(None, signal_name=_first_signal)


def end_start_up() -> None:
  """The run reached the point where stopping must wait for a safe, agreed point: a
  signal from now on only sets the flag. (A watchdog armed before still runs.)"""
  global _start_up, _interrupt
  _start_up = _interrupt = False


def reported() -> None:
  """The CLI printed its line about the stop: a watchdog that fires adds none."""
  _reported.set()


@contextlib.contextmanager
def undone_on_forced_exit(undo: Callable[[], None]):
  """Within the block, a watchdog exit calls `undo()` first."""
  _before_forced_exit.append(undo)
  try:
    yield
  finally:
    _before_forced_exit.remove(undo)


def _handle(signum, frame) -> None:
  global _first_signal
  del frame
  name = signal.Signals(signum).name
  if _requested.is_set():
    if not _start_up:
      logging.warning("%s again: already stopping", name)
    return
  _first_signal = name
  _requested.set()
  if _start_up:
    _arm_watchdog(Preempted(None, signal_name=name))
    if _interrupt:
      raise Preempted(None, signal_name=name)
    return
  logging.warning("%s: stopping at the next safe point (a loop boundary, or the end of "
                  "the current phase), then exiting %d", name, errors.preempted_exit_code())


def _arm_watchdog(stop: Preempted) -> None:
  """Exits 42 (--preempted_exit_code) after `_WATCHDOG_SECONDS`, saying so unless the run already did: a
  plug-in stuck in native code never lets the raised Preempted through."""
  def expire():
    if not _reported.is_set():
      line = (f"distloop: {stop} (the process did not stop within {_WATCHDOG_SECONDS:.0f} s "
              f"of the signal, stuck outside Python: ended at once)\n")
      try:
        os.write(2, line.encode())
      except OSError:
        pass
    for undo in list(_before_forced_exit):
      try:
        undo()
      except Exception:  # pylint: disable=broad-except  (exiting anyway)
        pass
    os._exit(errors.preempted_exit_code())  # pylint: disable=protected-access
  watchdog = threading.Timer(_WATCHDOG_SECONDS, expire)
  watchdog.daemon = True
  watchdog.start()


def request(why: str) -> None:
  """Asks the run to stop as a signal does (the flag; `why` logged as the signal's name
  is): user code at a boundary raising KeyboardInterrupt, which would otherwise end the
  process with a traceback and the step unsaved."""
  if _requested.is_set():
    logging.warning("%s: already stopping", why)
    return
  _requested.set()
  logging.warning("%s: stopping as on SIGINT, at the next safe point (a loop boundary, or "
                  "the end of the current phase), then exiting %d", why,
                  errors.preempted_exit_code())


def requested() -> bool:
  """True once SIGTERM/SIGINT/SIGHUP arrived in this process (a local view: see stop_agreed)."""
  return _requested.is_set()


def sleep(seconds: float) -> None:
  """time.sleep that a signal cuts short (continuous_eval polls with it)."""
  _requested.wait(max(seconds, 0.0))


_POLL_SECONDS = 0.05  # how often a bounded wait looks at the signal flag and the clock


class Abandoned(BaseException):
  """A bounded call was left running: a signal came (`signalled`) and it did not return
  within its grace, or it ran past its limit. A BaseException: no `except Exception` on
  the way up turns it into something else."""

  def __init__(self, what: str, *, signalled: bool, seconds: float):
    super().__init__(what)
    self.what, self.signalled, self.seconds = what, signalled, seconds


def bounded(function: Callable, *args, what: str, limit_seconds: float,
            grace_seconds: float, stop_requested: Callable[[], bool] = requested, **kwargs):
  """`function(*args, **kwargs)` in a daemon thread while this (main) thread keeps the
  signal protocol: returns its result or raises what it raised; raises Abandoned if it
  does not return within `grace_seconds` of a signal, or within `limit_seconds` (0: no
  limit). A thread left behind may go on running: the caller ends the process or stops
  using what it called (it holds no lock of the caller's). User Actions (3 s of grace:
  trainer/loop/boundary.py) and MLflow requests (none: trainer/reporters/mlflow_log.py)
  both run through here."""
  outcome = {}

  def call():
    try:
      outcome["value"] = function(*args, **kwargs)
    except BaseException as e:  # pylint: disable=broad-except  (re-raised in the caller)
      outcome["error"] = e

  thread = threading.Thread(target=call, name=f"distloop {what}", daemon=True)
  started = time.monotonic()
  signalled_at = None
  thread.start()
  while True:
    thread.join(_POLL_SECONDS)
    if not thread.is_alive():
      break
    now = time.monotonic()
    if signalled_at is None and stop_requested():
      signalled_at = now
    if signalled_at is not None and now - signalled_at >= grace_seconds:
      raise Abandoned(what, signalled=True, seconds=now - started)
    if limit_seconds and now - started >= limit_seconds:
      raise Abandoned(what, signalled=False, seconds=now - started)
  if "error" in outcome:
    raise outcome["error"]
  return outcome.get("value")


class PreemptionWatcher:
  """The loop's view of the flag: entering it takes the signals back from TensorFlow's
  runtime if they were installed (see reinstall); it installs nothing itself."""

  def __init__(self, agreement):
    self._agreement = agreement  # trainer.cluster.agreement.Agreement

  def __enter__(self) -> "PreemptionWatcher":
    reinstall()
    return self

  def __exit__(self, *exc_info) -> None:
    pass

  def stop_agreed(self) -> bool:
    """Every worker calls this at the same points; True on all of them or none."""
    return self._agreement.any(_requested.is_set())
