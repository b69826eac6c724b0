"""examples/ray_tune_sweep.py on a local Ray cluster bound to 127.0.0.1: `python -m
tests.support.ray_tune_job PATH`. Run it in the private network namespace
(tests/support/processes.py), as tests/support/ray_job.py.

With RAY_TUNE_RESULT=FILE it writes what a Tune user reads from the sweep's results to FILE
(JSON): per trial in grid order, its `learning_rate`, `trial_id`, `metrics` (the last
result's step and eval_/train_ values), `steps` (metrics_dataframe's step column),
`checkpoint_dir` (ray_train.checkpoint_dir of its checkpoint, or the one-line error), and
`best` (get_best_result's trial id and checkpoint_dir)."""
import json
import os

import trainer  # noqa: F401  first, as the example does: the CPU kernels, before TensorFlow

from tests.support.ray_job import run_example


def _checkpoint_dir(result):
  from trainer import ray_train
  from trainer.errors import UserError
  try:
    return result.checkpoint and ray_train.checkpoint_dir(result.checkpoint)
  except UserError as e:
    return f"error: {e}"


if __name__ == "__main__":
  results = run_example("ray_tune_sweep.py", "results")
  if os.environ.get("RAY_TUNE_RESULT"):
    trials = []
    for result in sorted(results, key=lambda r: r.path):  # the grid's order: trial index
      frame = result.metrics_dataframe
      trials.append({
          "learning_rate": result.config["learning_rate"],
          "trial_id": result.metrics["trial_id"],
          "metrics": {k: v for k, v in result.metrics.items()
                      if k == "step" or k.startswith(("eval_", "train_"))},
          "steps": None if frame is None else [int(s) for s in frame["step"]],
          "checkpoint_dir": _checkpoint_dir(result)})
    best = results.get_best_result(metric="eval_loss", mode="min")
    read = {"trials": trials, "best": {"trial_id": best.metrics["trial_id"],
                                        "checkpoint_dir": _checkpoint_dir(best)}}
    with open(os.environ["RAY_TUNE_RESULT"], "w", encoding="utf-8") as f:
      json.dump(read, f)
