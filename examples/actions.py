"""Two Actions in one file: a CSV log of every metric, and early stopping.

(Both are built in too -- model_dir/metrics.csv and checkpoint.early_stop_patience; these
show how an Action of your own is written.)

  python -m trainer --config=synthetic --model_dir=/tmp/distloop/early \
      --config.eval.interval=50 --config.train.steps=2000 \
      --config.train.actions=examples/actions.py:csv_log,examples/actions.py:early_stop

Each entry of train.actions is FUNCTION(config) -> Action(s). An action runs at
loop boundaries by its rule (every_steps, every_seconds, after_eval, at_end) on
every worker, sees the step and the latest metrics, and may return "stop" or
"save" -- agreed by all workers, so they all act at the same step.
"""
import csv
import os

import trainer


def csv_log(config):
  """model_dir/my_metrics.csv: one row per loop boundary (train) and per eval, by the chief.
  (distloop writes metrics.csv itself; this is how an Action writes a file of its own.)"""
  del config

  def write(boundary):
    if not boundary.is_chief:
      return
    rows = [("train", boundary.train)] + ([("eval", boundary.eval)] if boundary.evaluated else [])
    path = os.path.join(boundary.model_dir, "my_metrics.csv")
    new = not os.path.exists(path)
    with open(path, "a", newline="") as f:
      writer = csv.writer(f)
      if new:
        writer.writerow(["step", "split", "name", "value"])
      for split, values in rows:
        for name, value in sorted(values.items()):
          writer.writerow([boundary.step, split, name, value])

  return trainer.Action(write, every_boundary=True, name="csv_log")


def early_stop(config):
  """Stops when eval loss has not improved by early_stop.min_delta for early_stop.patience
  evals in a row (set eval.interval: it runs after each eval)."""
  settings = config.get("early_stop", {})
  patience, min_delta = settings.get("patience", 3), settings.get("min_delta", 0.0)
  metric, mode = settings.get("metric", "loss"), settings.get("mode", "min")
  best, waited = None, 0

  def check(boundary):
    nonlocal best, waited
    value = boundary.eval[metric]
    improved = best is None or (value < best - min_delta if mode == "min"
                                else value > best + min_delta)
    if improved:
      best, waited = value, 0
      return None
    waited += 1
    return "stop" if waited >= patience else None

  return trainer.Action(check, after_eval=True, name="early_stop")
