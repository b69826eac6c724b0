"""examples/gan.py: two models, two optimizers, noise from step.normal."""
import os

import numpy as np

from tests.support.cli import REPO
from tests.guarantees.workload import EVAL_BATCH, EVAL_EXAMPLES, SGD, XLA_RANDOM, Workload


def served(serve, replicas):
  """examples/gan.py's eval draws stateless noise [replica batch, 8] of seed (1, 2) on
  each replica, for each eval batch (96, 96, 64), split evenly over the replicas;
  `fake_left_of_zero` is the share of samples with x < 0."""
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  batches = [min(EVAL_BATCH, EVAL_EXAMPLES - start) for start in range(0, EVAL_EXAMPLES, EVAL_BATCH)]
  assert all(rows % replicas == 0 for rows in batches), (batches, replicas)
  noise = tf.concat([tf.random.stateless_normal([rows // replicas, 8], [1, 2])
                     for rows in batches for _ in range(replicas)], 0)
  samples = serve(noise=noise)["samples"].numpy()
  return {"eval_fake_left_of_zero": float(np.mean(samples[:, 0] < 0))}


WORKLOAD = Workload("gan", (f"--config={os.path.join(REPO, 'examples', 'gan.py')}", *SGD),
                    served=served, predicts="predict_step", not_applicable={("shapes_agree", "xla-1"): XLA_RANDOM})
