"""What a run reports, to one place: the contract of TensorBoard, metrics.csv, MLflow,
Weights & Biases and a user's own tracker (`runtime.loggers=...,MODULE:CLASS`).

On the chief only, of a run that trains, distloop calls, in this order:

    check()                         before anything is written: raise if you cannot
                                    report (the run is refused: one line, exit 2)
    start(config, model_dir)        the resolved config (a dict), once per process
    rewind(step)                    training goes on from `step`: after the restore (0 on
                                    a fresh start) and after a non-finite rollback
    write(step, split, values)      {name: float} of `split` ("train" at each loop
                                    boundary, "eval" after each eval) at `step`
    finish(summary, export_dir)     the run ended: summary.json's values and the exported
                                    SavedModel's folder (None: the task exports nothing)
    close()                         last, always (also after a failure or a preemption)

What a tracker logged past the step of a rewind was trained again. A tracker that can
delete it says `can_rewind = True` and drops it in `rewind`; for the others (the
default, MLflow's and W&B's) distloop keeps the highest step each wrote in
model_dir/reporters.json and never hands it a step twice: each step reaches every
tracker once, across SIGTERM, SIGKILL, rollbacks and resumes.

A failure in check or start refuses the run (exit 2); later, a call that raises (or
has not returned in 25 s, or is still running when a signal arrives) costs one warning
line and that tracker hears nothing more: training goes on. docs/monitoring.md has a
tracker in 20 lines.
"""


class Reporter:
  """Subclass it and override what your tracker needs; every method is a no-op here."""

  can_rewind = False  # True: rewind(step) deletes what this tracker holds past `step`
  # Optional, for a tracker that cannot rewind: the id of the tracker's run (a new one
  # holds nothing yet), and `highest_steps()` below.
  run_id: str | None = None
  writes_model_dir = False  # distloop's own writers (TensorBoard, metrics.csv): the store's

  def check(self) -> None:
    """Raise if the tracker cannot be reached: called before the run writes anything."""

  def start(self, config: dict, model_dir: str) -> None:
    """Open (or reopen, on a resume) the tracker's run; `config` is the resolved config."""

  def rewind(self, step: int) -> None:
    """Training goes on from `step`: what was logged past it is void."""

  def write(self, step: int, split: str, values: dict) -> None:
    """`values` ({name: float}) of `split` at `step`."""

  def finish(self, summary: dict, export_dir: str | None) -> None:
    """The run ended: summary.json's values; the SavedModel's folder, or None."""

  def close(self) -> None:
    """Release what start opened; called last, whatever happened."""

  def highest_steps(self) -> dict | None:
    """{split: the highest step the tracker's run holds}, asked after start on a resume;
    None: the tracker cannot say (distloop's record in reporters.json counts)."""
    return None
