"""What a loop's values can stop, checked as they come back at its boundary: per-step
scalars that differed between the replicas (refused, exit 2), and non-finite values
(train.nonfinite_policy: stop without saving them, or roll back to the last checkpoint
and skip past the data that diverged, at most train.max_rollbacks times).

Why apart from the controller: the flow only asks whether the loop's values may be
kept, and where training goes on from; the policies, the budget and their one-line
errors are here. The restore itself (agreed by every worker) is
trainer/state/train_state.py's.
"""
from absl import logging

from trainer.errors import NonFiniteError, UserError
from trainer.state.train_state import Position


class Rollbacks:
  """The run's rollbacks; `count` of them so far (summary.json's `rollbacks`)."""

  def __init__(self, config, train_state, *, reporters):
    self._config = config
    self._train_state = train_state
    self._reporters = reporters  # rewound to the step restored (no step reported twice)
    self.count = 0

  def roll_back(self, position: Position, reached: Position, non_finite: list,
                train_metrics: dict) -> Position:
    """Non-finite values (`non_finite`: the names of the step's), weights or optimizer
    state in the loop from `position` that ended at `reached`: NonFiniteError, or the
    position training goes on from (the last checkpoint's step, `reached`'s data)."""
    in_state = self._train_state.non_finite_keys() if not non_finite else None
    what = (f"non-finite {non_finite[0]} ({train_metrics[non_finite[0]]})" if non_finite
            else f"non-finite values in {(in_state or ['the state'])[0]}")
    where = (f"in steps {position.step + 1}..{reached.step}"
             if reached.step > position.step + 1 else f"in step {reached.step}")
    policy = self._config.train.nonfinite_policy
    last = self._train_state.last_checkpoint_words
    if policy == "stop":
      raise NonFiniteError(f"{what} {where}; stopped without saving them ({last()})")
    if self.count >= self._config.train.max_rollbacks:
      raise NonFiniteError(f"{what} {where} after {self.count} rollback(s) "
                           f"(train.max_rollbacks); stopped ({last()})")
    restored = self._train_state.restore_latest()
    if restored is None:
      raise NonFiniteError(f"{what} {where}, and no checkpoint to roll back to")
    self.count += 1
    self._reporters.rewind(restored.step)
    logging.warning("%s %s: rolled back to step %d and skipped the data up to example %d "
                    "(rollback %d of %d)", what, where, restored.step, reached.examples,
                    self.count, self._config.train.max_rollbacks)
    return Position(restored.step, reached.examples)


def refuse_replica_dependent(task, num_replicas: int, names: list, step: int,
                             num_steps: int) -> None:
  """Per-step scalars `names` differed between the replicas in the loop that just ran
  (Sums.reduce_checked): their mean over replicas would change with the replica count,
  so the run stops here, before anything of the loop is kept (exit 2, as a per-example
  value of the wrong length found as the step runs)."""
  if not names:
    return
  quoted = ", ".join(repr(name) for name in names)
  raise UserError(
      f"{type(task).__name__}.train_step returned per-step scalar(s) {quoted} that "
      f"differed between the {num_replicas} replicas in steps "
      f"{step + 1}..{step + num_steps}: a per-step scalar must be the same on every replica, "
      f"not depend on the replica's share of the batch; return per-example values [batch] "
      f"(distloop sums them over the global batch) or reduce it over the global batch "
      f"with the step's collective (e.g. tf.reduce_max(step.all_gather(per_example)))")
