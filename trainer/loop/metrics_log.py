"""model_dir/metrics.csv: every metric distloop reports, one row per (step, split, name).

Written by the chief at every loop boundary (the loop's train metrics, the learning rate)
and after every eval; a long table (`step,split,name,value`) so that a metric that appears
later (an eval, a Task's own value) needs no new column: `pandas.read_csv(...).pivot_table(
index="step", columns=["split", "name"], values="value")`. Exactly once per step: a resumed
(or rolled back) run first drops the rows past the step it restored, as TensorBoard's
purge_step does, so a step re-trained after a preemption is not logged twice.
"""
import csv
import os

from trainer.state import model_dir as layout

HEADER = ["step", "split", "name", "value"]


class MetricsLog:
  """The chief's metrics.csv; other workers hold one that writes nothing."""

  def __init__(self, model_dir: str, *, enabled: bool):
    self.path = layout.metrics_csv_path(model_dir)
    self._enabled = enabled

  def restart_at(self, step: int) -> None:
    """Keeps the rows up to `step` (the restored one; 0: a fresh start keeps none)."""
    if not self._enabled:
      return
    kept = []
    if os.path.exists(self.path):
      with open(self.path, newline="") as f:
        kept = [row for row in csv.reader(f) if row and row[0].isdigit() and int(row[0]) <= step]
    temporary = self.path + ".tmp"
    with open(temporary, "w", newline="") as f:
      writer = csv.writer(f)
      writer.writerow(HEADER)
      writer.writerows(kept)
    os.replace(temporary, self.path)

  def write(self, step: int, split: str, values: dict) -> None:
    if not self._enabled or not values:
      return
    with open(self.path, "a", newline="") as f:
      writer = csv.writer(f)
      for name, value in values.items():
        writer.writerow([step, split, name, repr(float(value))])
