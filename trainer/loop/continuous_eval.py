"""`--mode=continuous_eval`: a sidecar that evaluates each new checkpoint of a live job.

Who owns what: the training job writes checkpoints/ and deletes old steps
(checkpoint.max_to_keep); this sidecar only reads them, through the Trainer's
read-only manager, and writes tensorboard/eval/ scalars (Trainer.evaluate does).
It never writes, moves or deletes anything in checkpoints/.

    evaluated = none
    until the final step (>= train.steps) is evaluated:
        training finished below train.steps (finished.json: an early stop)? that
            step is the final one (read before listing: its checkpoint is on disk first)
        steps = the committed steps on disk now (re-listed: orbax caches its list)
        for each step newer than the last one seen, in increasing order:
            gone or unreadable (retention deleted it first)? warn, skip it
            else restore it, evaluate it (eval/loss, eval/accuracy at that step)
        nothing new for eval.timeout_seconds -> Unfinished (exit 1)
        nothing new -> sleep eval.poll_seconds
        SIGTERM/SIGINT/SIGHUP (`stopped()`) -> Preempted between evals (exit 42)

Every checkpoint is evaluated, oldest first; it does not jump to the newest when
it falls behind. A step that retention deletes before the sidecar reaches it (or
while it reads it) cannot be evaluated: it is skipped with a warning. To see every
step, keep checkpoint.max_to_keep above the number of checkpoints written during one eval.

Pure Python: the trainer is passed in (anything with `checkpoints.reload()`,
`checkpoints.all_steps()`, `checkpoints.directory`, `restore(step)` and
`evaluate(step)`), and so are the clock, sleep, the stop request and the read of
finished.json (`finished`), so a test can fake all of them.
"""
import os
import time
from typing import Callable

from absl import logging

from trainer.errors import Preempted, UserError
from trainer.store import files

# A step that retention is deleting can fail the shape check (its metadata gone first)
# and look like another model's; it is one only if it is still there this much later.
_DELETION_GRACE_SECONDS = 1.0


class Unfinished(Exception):
  """The final step will not be evaluated: nothing new for eval.timeout_seconds, or the
  final step itself was unreadable. Exit 1."""


class ContinuousEval:
  """Evaluates every new checkpoint step in increasing order until `final_step`."""

  def __init__(self, trainer, *, final_step: int, poll_seconds: float, timeout_seconds: float,
               clock: Callable[[], float] = time.monotonic,
               sleep: Callable[[float], None] = time.sleep,
               stopped: Callable[[], bool] = lambda: False,
               finished: Callable[[], int | None] = lambda: None):
    self.trainer = trainer
    self.final_step = final_step
    self.poll_seconds = poll_seconds
    self.timeout_seconds = timeout_seconds  # 0: wait forever
    self._clock = clock
    self._sleep = sleep
    self._stopped = stopped
    self._finished = finished  # the step training ended at, once it says so (finished.json)
    self.evaluated: list[int] = []  # steps evaluated, in order
    self.skipped: list[int] = []    # steps seen but gone or unreadable
    self._last_seen: int | None = None

  def run(self) -> list[int]:
    """Returns the steps evaluated; raises Unfinished after the timeout or if the final
    step is unreadable, UserError if the checkpoints are another model's."""
    directory = self.trainer.checkpoints.directory
    logging.info("continuous_eval: watching %s until step %d (polling every %g s; %s)",
                 directory, self.final_step, self.poll_seconds,
                 f"giving up after {self.timeout_seconds:g} s without a new checkpoint"
                 if self.timeout_seconds else "no timeout")
    last_news = self._clock()
    while True:
      if self._stopped():  # nothing of ours to save: the next run evaluates what is left
        raise Preempted(self.evaluated[-1] if self.evaluated else None)
      self._read_finished()
      new_steps = [step for step in self._steps_on_disk()
                   if self._last_seen is None or step > self._last_seen]
      if new_steps:
        if self._evaluate_in_order(new_steps):
          logging.info("continuous_eval: evaluated %d checkpoint(s); the final step %d is done",
                       len(self.evaluated), self.evaluated[-1])
          return self.evaluated
        last_news = self._clock()
        continue  # evaluating took a while: look again before sleeping
      if self._last_seen is not None and self._last_seen >= self.final_step:
        if self.evaluated and self.evaluated[-1] == self._last_seen:  # seen before the record
          logging.info("continuous_eval: training finished at step %d, evaluated",
                       self.final_step)
          return self.evaluated
        raise Unfinished(f"continuous_eval: the final step {self.final_step} in {directory} "
                         f"could not be read ({len(self.evaluated)} checkpoint(s) evaluated)")
      waited = self._clock() - last_news
      if self.timeout_seconds and waited >= self.timeout_seconds:
        last = (f"the last evaluated is step {self.evaluated[-1]}" if self.evaluated
                else "none evaluated yet")
        raise Unfinished(
            f"continuous_eval: no new checkpoint in {self.timeout_seconds:g} s in {directory} "
            f"({last}; waiting for step {self.final_step}); is the training job running? "
            f"(eval.timeout_seconds, 0 = wait forever)")
      self._sleep(self.poll_seconds if not self.timeout_seconds
                  else min(self.poll_seconds, self.timeout_seconds - waited))

  def _read_finished(self) -> None:
    """Training ended below final_step (an early stop): that step is the final one."""
    step = self._finished()
    if step is not None and step < self.final_step:
      logging.info("continuous_eval: training finished at step %d (finished.json); that is "
                   "the final step", step)
      self.final_step = step

  def _evaluate_in_order(self, new_steps: list[int]) -> bool:
    """Evaluates `new_steps` oldest first; True once the final step is evaluated."""
    for step in new_steps:
      self._last_seen = step
      if not self._readable(step):
        self.skipped.append(step)
        continue
      self.trainer.evaluate(step)  # logs "eval at step N | loss | accuracy | examples"
      self.evaluated.append(step)
      if step >= self.final_step:
        return True
    if self._last_seen >= self.final_step:  # the final step was skipped: nothing more will come
      raise Unfinished(f"continuous_eval: the final step {self._last_seen} in "
                       f"{self.trainer.checkpoints.directory} could not be read "
                       f"({len(self.evaluated)} checkpoint(s) evaluated before it)")
    return False

  def _readable(self, step: int) -> bool:
    """Loads `step` into the model; False (with a warning) if it is gone or unreadable."""
    path = os.path.join(self.trainer.checkpoints.directory, str(step))
    if not os.path.isdir(path):
      logging.warning("continuous_eval: skipped step %d: deleted (checkpoint.max_to_keep) "
                      "before it could be read", step)
      return False
    try:
      position = self.trainer.restore(step)
    except UserError as e:
      self._sleep(_DELETION_GRACE_SECONDS)
      if os.path.isdir(path):
        raise  # another model's checkpoint: exit 2
      logging.warning("continuous_eval: skipped step %d: deleted (checkpoint.max_to_keep) "
                      "while it was read (%s)", step, e)
      return False
    if position is None:  # it warned why (read-only: nothing is moved)
      logging.warning("continuous_eval: skipped step %d: it could not be read (deleted by "
                      "checkpoint.max_to_keep while it was read?); going on with the next", step)
      return False
    return True

  def _steps_on_disk(self) -> list[int]:
    """Committed steps, re-read from disk (the directory may not exist yet)."""
    checkpoints = self.trainer.checkpoints
    if not os.path.isdir(checkpoints.directory):  # a bucket's staging: none until a step came
      files.fetch_new_steps(checkpoints.directory)
    if not os.path.isdir(checkpoints.directory):
      return []
    try:
      checkpoints.reload()
    except OSError as e:  # a step deleted by retention while orbax listed it: next poll
      logging.warning("continuous_eval: listing %s failed (%s); trying again",
                      checkpoints.directory, e)
      return []
    return checkpoints.all_steps()
