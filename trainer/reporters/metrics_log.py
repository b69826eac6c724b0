"""model_dir/metrics.csv: every metric distloop reports, one row per (step, split, name).

Written by the chief at every loop boundary (the loop's train metrics, the learning rate)
and after every eval; a long table (`step,split,name,value`) so that a metric that appears
later (an eval, a Task's own value) needs no new column: `pandas.read_csv(...).pivot_table(
index="step", columns=["split", "name"], values="value")`. Exactly once per step: a resumed
(or rolled back) run first drops the rows past the step it restored, as TensorBoard's
purge_step does, so a step re-trained after a preemption is not logged twice.
"""
import csv
import io
import os

from trainer.reporters.contract import Reporter
from trainer.store import files
from trainer.store import model_dir as layout
from trainer.store import storage

HEADER = ["step", "split", "name", "value"]


class MetricsLog(Reporter):
  """runtime.loggers' `csv` (contract.py): the chief's metrics.csv; other workers (and a
  run without `csv`) hold one that writes nothing."""

  writes_model_dir = True  # the store's writer: a full disk is the run's failure
  can_rewind = True  # restart_at drops the rows past the step

  def __init__(self, model_dir: str, *, enabled: bool):
    self.path = layout.metrics_csv_path(model_dir)
    self._enabled = enabled
    self._rows = files.Appender(self.path)  # open while the run writes (flushed every write)

  def restart_at(self, step: int) -> None:
    """Keeps the rows up to `step` (the restored one); nothing to do for a fresh start."""
    if not self._enabled or not os.path.exists(self.path):
      return
    self.close()
    with open(self.path, newline="") as f:
      kept = [row for row in csv.reader(f) if _whole(row) and int(row[0]) <= step]
    files.write_text(self.path, _csv([HEADER, *kept]), what="metrics.csv")

  def rewind(self, step: int) -> None:
    self.restart_at(step)

  def last(self, split: str, step: int) -> dict:
    """{name: value} of the last `split` row at or before `step` ({} if none, or on a worker
    that writes none): what a process that trained no step reports (resumed at the
    final step)."""
    if not self._enabled or not os.path.exists(self.path):
      return {}
    found, at = {}, -1
    with open(self.path, newline="") as f:
      for row in csv.reader(f):
        if len(row) == 4 and row[0].isdigit() and row[1] == split and at <= int(row[0]) <= step:
          if int(row[0]) > at:
            found, at = {}, int(row[0])
          found[row[2]] = float(row[3])
    return found

  def rows(self, upto: int) -> list[tuple[int, str, dict]]:
    """[(step, split, {name: value})] of the rows up to step `upto`, in the file's order
    (what a tracker that missed them is handed: trainer/reporters/fan_out.py)."""
    if not self._enabled or not os.path.exists(self.path):
      return []
    grouped = {}
    with open(self.path, newline="") as f:
      for row in csv.reader(f):
        if _whole(row) and int(row[0]) <= upto:
          grouped.setdefault((int(row[0]), row[1]), {})[row[2]] = float(row[3])
    return [(step, split, values) for (step, split), values in grouped.items()]

  def write(self, step: int, split: str, values: dict) -> None:
    if not self._enabled or not values:
      return
    rows = [[step, split, name, repr(float(value))] for name, value in values.items()]
    try:
      self._rows.write(_csv([HEADER, *rows] if self._rows.is_new else rows))
    except OSError as error:
      self.close()
      raise self._failure(error) from None

  def close(self) -> None:
    self._rows.close()

  def _failure(self, error: OSError) -> Exception:
    """A full disk or a denied write: the one line (StorageError); anything else as is."""
    if storage.reason(error) is None:
      return error
    return storage.failure("metrics.csv", self.path, error)


def _csv(rows: list[list]) -> str:
  text = io.StringIO()
  csv.writer(text).writerows(rows)
  return text.getvalue()


def _whole(row: list[str]) -> bool:
  """A row written whole: a copy of a file being appended to (a bucket's, taken at a
  checkpoint) may end in half a row."""
  if len(row) != 4 or not row[0].isdigit():
    return False
  try:
    float(row[3])
  except ValueError:
    return False
  return True
