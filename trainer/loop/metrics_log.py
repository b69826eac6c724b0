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
from trainer.state import storage

HEADER = ["step", "split", "name", "value"]


class MetricsLog:
  """The chief's metrics.csv; other workers hold one that writes nothing."""

  def __init__(self, model_dir: str, *, enabled: bool):
    self.path = layout.metrics_csv_path(model_dir)
    self._enabled = enabled
    self._file = None  # open for appending while the run writes (flushed every write)
    self._writer = None

  def restart_at(self, step: int) -> None:
    """Keeps the rows up to `step` (the restored one); nothing to do for a fresh start."""
    if not self._enabled or not os.path.exists(self.path):
      return
    self.close()
    with open(self.path, newline="") as f:
      kept = [row for row in csv.reader(f) if _whole(row) and int(row[0]) <= step]
    temporary = self.path + ".tmp"
    try:
      with open(temporary, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(HEADER)
        writer.writerows(kept)
      os.replace(temporary, self.path)
    except OSError as error:
      if os.path.exists(temporary):
        os.remove(temporary)
      raise self._failure(error) from None

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

  def write(self, step: int, split: str, values: dict) -> None:
    if not self._enabled or not values:
      return
    try:
      if self._file is None:  # opened once, not at every boundary (a tiny model has ~100/s)
        new = not os.path.exists(self.path)
        self._file = open(self.path, "a", newline="")  # pylint: disable=consider-using-with
        self._writer = csv.writer(self._file)
        if new:
          self._writer.writerow(HEADER)
      self._writer.writerows([step, split, name, repr(float(value))]
                             for name, value in values.items())
      self._file.flush()  # a crash loses no row the OS was given
    except OSError as error:
      self.close()
      raise self._failure(error) from None

  def close(self) -> None:
    if self._file is not None:
      file, self._file, self._writer = self._file, None, None
      try:
        file.close()
      except OSError:
        pass  # the rows were flushed; a failing close has nothing left to say

  def _failure(self, error: OSError) -> Exception:
    """A full disk or a denied write: the one line (StorageError); anything else as is."""
    if storage.reason(error) is None:
      return error
    return storage.failure("metrics.csv", self.path, error)


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
