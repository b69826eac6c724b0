"""What a guarantee workload is (`Workload`), the flags every run adds, and the scorers
and tolerances more than one workload shares. Each workload is one file of workloads/
(its `WORKLOAD` and any code only it uses); catalogue.py collects them.

An entry is what a user would type (flags on the public contract, plug-ins from tests/
and examples/), plus how to score its export on the eval data in numpy (`served`), so
that the export check can compare the served predictions with what eval reported.
Every run adds `COMMON` (40 steps of 32, loops of 5, a checkpoint every 10, all kept,
deterministic kernels) and its replica flags.
"""
import dataclasses
import types
from typing import Callable

import numpy as np


STEPS = 40
EVAL_EXAMPLES = 256
EVAL_BATCH = 96  # 256 eval examples: 96, 96 and a partial 64 (32 per replica); 1000: ... 40
# An eval every 10 steps (train_and_eval): the evals of a resumed process read its live
# state (EMA weights, BatchNorm statistics, a Task's variables), not only what its
# checkpoints hold, so state left out of a checkpoint changes a logged eval value.
EVALS = ("--mode=train_and_eval", "--config.eval.interval=10")  # a workload that `evaluates`
COMMON = ("--config.train.steps=40", "--config.train.global_batch_size=32",
          "--config.train.steps_per_loop=5", "--config.checkpoint.interval=10",
          "--config.checkpoint.max_to_keep=10", "--config.runtime.deterministic=true",
          "--config.data.num_train_examples=512",
          f"--config.data.num_eval_examples={EVAL_EXAMPLES}",
          f"--config.eval.global_batch_size={EVAL_BATCH}")
# What the resume_changed check changes at step 20 (of the run with COMMON, as it was
# then): every kind of field a resume may change (docs/fault-tolerance.md): the
# batch size (the data position is counted in examples), the loop length, the eval
# batch and the learning rate (x 1.5, added per workload: `changed_flags`).
# Every shape agrees with 1 replica to this after 40 plain-SGD steps unless the workload
# says otherwise (`agree_within`).
AGREE_DEFAULT = 1e-7
CHANGED_AT = 20
CHANGES = ("--config.train.global_batch_size=64", "--config.train.steps_per_loop=4",
           "--config.eval.global_batch_size=64")
# The elastic check resumes the step that a run of 2 replicas kept here on 1 replica.
ELASTIC_AT = 20
# Plain SGD at a small rate: updates proportional to the gradient, so a reduction
# counted twice (or missing) moves the weights by far more than the rounding of a
# summation order that depends on the replica count (tests/loop/test_replica_equivalence.py).
# Plain SGD, without the optimizer arguments of a workload's own config (examples/gan.py's
# Adam beta_1).
SGD = ("--config.train.optimizer=sgd", "--config.train.optimizer_args=",
       "--config.train.learning_rate=0.02")
DATA = types.SimpleNamespace(num_train_examples=512, num_eval_examples=256)


EVERY_CHECK = "every check"  # a not_applicable key: (EVERY_CHECK, shape)


@dataclasses.dataclass(frozen=True)
class Workload:
  name: str
  flags: tuple[str, ...]
  # (serve, replicas) -> {summary.json key: value} computed from the export's outputs on
  # the eval data; None: what it exports cannot be scored against its eval.
  served: Callable | None = None
  # Flags that make it plain SGD for the 1 = 2 replicas check, when `flags` are not.
  sgd_flags: tuple[str, ...] = ()
  # Checks that do not apply: {check: why} on every shape, {(check, shape): why} on one,
  # {(EVERY_CHECK, shape): why} every check on one shape.
  # Cells failing on a known defect: the same keys -> reason (xfail, strict: unmark once
  # fixed). Shapes: tests/guarantees/conftest.py SHAPES.
  not_applicable: dict = dataclasses.field(default_factory=dict)
  known_defects: dict = dataclasses.field(default_factory=dict)
  donor: str = "cnn"  # whose checkpoint the refusal check copies in (shapes differ)
  evaluates: bool = True  # False: a Task without eval_step (trains with --mode=train)
  eval_examples: int = EVAL_EXAMPLES  # its eval split's size (a plug-in may fix its own)
  # shapes_agree: how far each shape's weights may be from 1 replica's after 40 plain-SGD
  # steps, as measured (tests/guarantees/__init__.py: "Tolerances"); a shape not listed
  # must agree to AGREE_DEFAULT. Loose enough for the rounding each shape really has,
  # tight enough that another summation order (threads per op) fails the cell.
  agree_within: dict = dataclasses.field(default_factory=dict)
  # resume_changed: a change (CHANGES) the workload cannot make on resume, refused in one
  # line: {why}; the check then asserts the refusal instead of the trajectory.
  refuses_change: str | None = None
  # elastic: the trajectory depends on the replica count, so a resume on 1 replica of a step
  # trained on 2 is refused in one line, which names this; the check asserts the refusal.
  refuses_elastic: str | None = None
  # predict: what --mode=predict writes: "export" (the served outputs: each row equals the
  # export's on that example), "predict_step" (the Task's own columns), None (a Task with
  # neither: refused in one line).
  predicts: str | None = "export"

  def changed_flags(self) -> tuple[str, ...]:
    """CHANGES and the workload's own learning rate x 1.5 (its last --config.train.learning_rate)."""
    rates = [flag for flag in self.flags if flag.startswith("--config.train.learning_rate=")]
    rate = float(rates[-1].split("=", 1)[1]) if rates else 0.02
    return (*CHANGES, f"--config.train.learning_rate={rate * 1.5:g}")

  def agreement(self, shape: str) -> float:
    return self.agree_within.get(shape, AGREE_DEFAULT)

  def why_not(self, check: str, shape: str) -> str | None:
    return (self.not_applicable.get((check, shape)) or self.not_applicable.get(check)
            or self.not_applicable.get((EVERY_CHECK, shape)))

  def defect(self, check: str, shape: str) -> str | None:
    return self.known_defects.get((check, shape)) or self.known_defects.get(check)


def _cross_entropy(probabilities, labels) -> float:
  probabilities = np.clip(np.asarray(probabilities, np.float64), 1e-7, 1 - 1e-7)
  picked = probabilities[np.arange(len(labels)), labels]
  return float(np.mean(-np.log(picked / probabilities.sum(-1))))


def classified(probabilities, labels, prefix="") -> dict:
  return {f"eval_{prefix}loss": _cross_entropy(probabilities, labels),
          f"eval_{prefix}accuracy": float(np.mean(np.argmax(probabilities, -1) == labels))}


def synthetic_eval():
  from input_pipelines.datasets import synthetic  # pylint: disable=import-outside-toplevel
  splits = synthetic.build(DATA, seed=0)
  return (splits.test_images.astype(np.float32) / 255.0)[..., None], splits.test_labels


def served_cnn(serve, replicas):
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  images, labels = synthetic_eval()
  return classified(serve(images=tf.constant(images))["probabilities"].numpy(), labels)



def served_batchnorm(serve, replicas):
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  from tests.plugins import batchnorm_plugins  # pylint: disable=import-outside-toplevel
  images, labels = batchnorm_plugins.images(DATA, seed=0)[1]
  return classified(serve(inputs=tf.constant(images))["probabilities"].numpy(), labels)


def served_sequences(serve, replicas):
  """Each eval sequence served alone, at its own length (docs/data.md: any length)."""
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  from tests.plugins import sequence_plugins  # pylint: disable=import-outside-toplevel
  sequences, labels = sequence_plugins.numpy_sequences(DATA, seed=0)[1]
  probabilities = np.concatenate([serve(inputs=tf.constant(tokens[None]))["probabilities"]
                                  for tokens in sequences])
  return classified(probabilities, labels)


# shapes_agree on xla-1, not applicable: whole-step XLA draws other random numbers.
XLA_RANDOM = ("XLA draws other numbers than TensorFlow's kernels from the same stateless seed "
              "(its normal transform, and auto_select's algorithm): the noise differs from "
              "1 replica's, not within a run")


def within(tolerance: float) -> dict:
  """agree_within: `tolerance` on every shape."""
  return {"2": tolerance, "central_storage-2": tolerance, "xla-1": tolerance}


def _on_two_replicas(why: str) -> dict:
  """Not applicable: agreement with 1 replica on the shapes of 2 (XLA's 1 still agrees)."""
  return {("shapes_agree", "2"): why, ("shapes_agree", "central_storage-2"): why}


def refused_on_two_replicas(because: str, refusal: str) -> dict:
  """shapes_agree not applicable on the shapes of 2, only because distloop refuses to mix
  replica counts for the workload (`refuses_elastic`): the elastic check asserts that."""
  return _on_two_replicas(f"{because}: 1 and 2 replicas train different models by design, and "
                         f"distloop refuses to resume one on the other ({refusal!r}), as the "
                         f"elastic check asserts")
