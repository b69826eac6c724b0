"""What a run has done so far, kept in one place the flow updates and the boundaries read.

The Trainer's own attributes are set once, in its constructor; what changes as the run
goes (the step it resumed from and the latest it reached, the latest eval, the seconds
eval and the saves took) changes here, named, instead of as attributes set across its
methods. What the loops leave for the end of the run is returned as `Trained`.
"""
import dataclasses

from trainer.loop import progress
from trainer.state.train_state import Position


@dataclasses.dataclass
class RunRecord:
  """The run so far, as this process saw it; summary.json is made from it."""
  started_at: int = 0  # the step this process resumed from
  step_reached: int | None = None  # its latest loop boundary (None before its first)
  evaluated_at: int | None = None  # the step of the latest eval
  eval_metrics: dict | None = None  # its values
  eval_seconds: float = 0.0
  checkpoint_seconds: float = 0.0  # what the saves blocked training for

  def summary(self, trained: "Trained", train_values: dict, eval_values: dict, *,
              eval_examples: int, strategy, strategy_name: str, rollbacks: int,
              wall_seconds: float) -> dict:
    """summary.json: the run's last values and where its time went."""
    summary = {
        "step": trained.position.step,
        # The built-in task's train_loss is the data loss + the regularization, as trained.
        **{f"train_{name}": value for name, value in train_values.items()},
        **{f"eval_{name}": value for name, value in eval_values.items()},
        "eval_examples": eval_examples,
        "examples_per_sec": trained.throughput.per_second(),
        "num_replicas": strategy.num_replicas_in_sync,
        "strategy": strategy_name,
        "rollbacks": rollbacks,
        # Steps this process trained (0: resumed at the final step; train_* are then the
        # values logged there).
        "trained_steps": trained.position.step - self.started_at,
        "wall_time_sec": wall_seconds,
        "train_time_sec": trained.throughput.seconds,
        "eval_time_sec": self.eval_seconds,
        "checkpoint_time_sec": self.checkpoint_seconds,
    }
    if trained.stopped_by is not None:
      summary["stopped_early_by"] = trained.stopped_by
    if trained.stop_reason is not None:
      summary["stop_reason"] = trained.stop_reason
    return summary


@dataclasses.dataclass
class Trained:
  """What the training loops leave: where they stopped and the last loop's values."""
  position: Position
  train_metrics: dict
  throughput: progress.Throughput
  stopped_by: str | None  # the Action that stopped training early, if one did
  stop_reason: str | None = None  # its trainer.Stop's reason
