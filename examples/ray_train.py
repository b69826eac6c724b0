"""Trains any distloop config on N Ray workers through Ray Train's TensorflowTrainer.

  pip install -e '.[ray]'
  python examples/ray_train.py --config=mnist_cnn --model_dir=/shared/run1 --num_workers=4

Any of python -m trainer's flags (--config.FIELD=VALUE, --mode=train_and_eval), plus
--num_workers (2), --max_failures (3) and --storage_path (Ray's own records; default:
model_dir's parent). model_dir must be on storage every Ray node sees: a worker that fails
or dies makes Ray restart the group, which resumes from the latest checkpoint there.
"""
import sys

import trainer  # noqa: F401  first: picks the CPU kernels before TensorFlow loads (workers inherit)
from trainer import ray_train

job = ray_train.Job.from_flags(sys.argv)  # bad input: one line, exit 2, before TensorFlow and Ray
from ray.train import FailureConfig, RunConfig, ScalingConfig  # noqa: E402
from ray.train.tensorflow import TensorflowTrainer  # noqa: E402

result = TensorflowTrainer(
    ray_train.train_loop, train_loop_config=job.loop_config,
    scaling_config=ScalingConfig(num_workers=job.num_workers),
    run_config=RunConfig(name=job.name, storage_path=job.storage_path,
                         failure_config=FailureConfig(max_failures=job.max_failures)),
).fit()
print(result.metrics)  # rank 0's summary.json: step, train_loss, eval_accuracy, ...
print(ray_train.checkpoint_dir(result.checkpoint))  # <model_dir>/checkpoints/<final step>
