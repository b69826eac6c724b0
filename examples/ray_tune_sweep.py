"""A Ray Tune sweep of distloop trials: 4 learning rates, ASHA stops the poor ones early.

  pip install -e '.[ray]'
  python examples/ray_tune_sweep.py /tmp/distloop/sweep     # killed? the same command resumes

Tune's records go to <path>/tune, each trial's model_dir is <path>/model_dirs/<trial id>
(a bucket's URL works too: gs://bucket/sweep). The trials run one at a time on fixed
seeds, so the sweep's results are the same however often its driver is killed and rerun.
"""
import os
import sys

import trainer  # noqa: F401  first: picks the CPU kernels before TensorFlow loads
import configs
from trainer import ray_train
from trainer.sweeps import ray_tune

os.environ.setdefault("TUNE_GLOBAL_CHECKPOINT_S", "0")  # Tune's state after every result
from ray import tune  # noqa: E402

STEPS = 60


def sweep(path: str) -> tune.ResultGrid:
  root = f"{path.rstrip('/')}/model_dirs"

  def trial(params):  # in a Ray worker, one process per trial
    config = configs.get("synthetic")
    config.train.steps, config.train.steps_per_loop = STEPS, 5
    config.eval.interval, config.checkpoint.interval = 10, STEPS  # each eval is reported and saved
    config.data.num_train_examples, config.data.num_eval_examples = 512, 256
    config.train.optimizer, config.train.learning_rate = "sgd", params["learning_rate"]
    config.runtime.deterministic, config.runtime.seed = True, 0
    ray_tune.run_trial(config, root)

  experiment = f"{path.rstrip('/')}/tune/sweep"
  if tune.Tuner.can_restore(experiment):  # a driver killed before: its trials resume
    tuner = tune.Tuner.restore(experiment, trial, resume_unfinished=True)
  else:
    tuner = tune.Tuner(
        trial, param_space={"learning_rate": tune.grid_search([0.03, 0.001, 0.1, 0.05])},
        tune_config=tune.TuneConfig(
            max_concurrent_trials=1,
            scheduler=ray_tune.ASHA(metric="eval_loss", mode="min", max_t=STEPS,
                                    grace_period=10, reduction_factor=2)),
        run_config=tune.RunConfig(name="sweep", storage_path=f"{path.rstrip('/')}/tune"))
  return tuner.fit()


if __name__ == "__main__":
  results = sweep(sys.argv[1])
  for result in results:
    stopped = result.metrics["step"] < STEPS  # ASHA stopped it at that eval
    print(f"trial {result.metrics['trial_id']} learning_rate={result.config['learning_rate']} "
          f"step={result.metrics['step']} eval_loss={result.metrics['eval_loss']:.4f} "
          f"{'stopped early' if stopped else 'finished'} "
          f"checkpoint={ray_train.checkpoint_dir(result.checkpoint)}")
  best = results.get_best_result(metric="eval_loss", mode="min")
  print(f"best: learning_rate={best.config['learning_rate']} "
        f"checkpoint={ray_train.checkpoint_dir(best.checkpoint)}")
