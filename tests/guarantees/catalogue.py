"""The workloads every guarantee is checked on: one `Workload` entry each.

An entry is what a user would type (flags on the public contract, plug-ins from tests/
and examples/), plus how to score its export on the eval data in numpy (`served`), so
that the export check can compare the served predictions with what eval reported.
Every run adds `COMMON` (40 steps of 32, loops of 5, a checkpoint every 10, all kept,
deterministic kernels) and its replica flags.
"""
import dataclasses
import os
import types
from typing import Callable

import numpy as np

from tests.cli import REPO

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
# summation order that depends on the replica count (tests/test_replica_equivalence.py).
# Plain SGD, without the optimizer arguments of a workload's own config (examples/gan.py's
# Adam beta_1).
SGD = ("--config.train.optimizer=sgd", "--config.train.optimizer_args=",
       "--config.train.learning_rate=0.02")
_GAN = os.path.join(REPO, "examples", "gan.py")
_DATA = types.SimpleNamespace(num_train_examples=512, num_eval_examples=256)


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


def _classified(probabilities, labels, prefix="") -> dict:
  return {f"eval_{prefix}loss": _cross_entropy(probabilities, labels),
          f"eval_{prefix}accuracy": float(np.mean(np.argmax(probabilities, -1) == labels))}


def _synthetic_eval():
  from input_pipelines.datasets import synthetic  # pylint: disable=import-outside-toplevel
  splits = synthetic.build(_DATA, seed=0)
  return (splits.test_images.astype(np.float32) / 255.0)[..., None], splits.test_labels


def _served_cnn(serve, replicas):
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  images, labels = _synthetic_eval()
  return _classified(serve(images=tf.constant(images))["probabilities"].numpy(), labels)


def _served_logits(serve, replicas):
  """A Task's export of logits (tests/guarantees/workloads.py's Counter)."""
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  images, labels = _synthetic_eval()
  logits = serve(images=tf.constant(images))["logits"].numpy().astype(np.float64)
  probabilities = np.exp(logits - logits.max(-1, keepdims=True))
  return _classified(probabilities / probabilities.sum(-1, keepdims=True), labels)


def _served_softmax(serve, replicas):
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  from tests import keras_plugins  # pylint: disable=import-outside-toplevel
  features, labels = keras_plugins.four_classes(_DATA, seed=0)[1]
  return _classified(serve(inputs=tf.constant(features))["probabilities"].numpy(), labels)


def _served_batchnorm(serve, replicas):
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  from tests import batchnorm_plugins  # pylint: disable=import-outside-toplevel
  images, labels = batchnorm_plugins.images(_DATA, seed=0)[1]
  return _classified(serve(inputs=tf.constant(images))["probabilities"].numpy(), labels)


def _served_two_heads(serve, replicas):
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  from tests import multi_output_plugins  # pylint: disable=import-outside-toplevel
  features, labels = multi_output_plugins.arrays(_DATA, seed=0)[1]
  outputs = serve(inputs=tf.constant(features))
  scores = _classified(outputs["class"].numpy(), labels["class"], prefix="class_")
  squared = np.mean((outputs["value"].numpy()[:, 0].astype(np.float64) - labels["value"]) ** 2)
  return {"eval_class_accuracy": scores["eval_class_accuracy"],
          "eval_loss": scores["eval_class_loss"] + 0.5 * squared}


def _served_sequences(serve, replicas):
  """Each eval sequence served alone, at its own length (docs/data.md: any length)."""
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  from tests import sequence_plugins  # pylint: disable=import-outside-toplevel
  sequences, labels = sequence_plugins.numpy_sequences(_DATA, seed=0)[1]
  probabilities = np.concatenate([serve(inputs=tf.constant(tokens[None]))["probabilities"]
                                  for tokens in sequences])
  return _classified(probabilities, labels)


def _served_gan(serve, replicas):
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


# What the refusal of an elastic resume names (trainer/state/replica_dependence.py), and why.
_BATCHNORM_REFUSAL = "BatchNormalization 'bn' (unsynchronized"
_BATCHNORM_REPLICAS = ("BatchNormalization normalizes each replica's own share in training "
                       "(Keras synchronized=False)")
_GENERATOR_REFUSAL = "randomness drawn per replica"
_GENERATOR_REPLICAS = "a tf.random.Generator draws another stream on each replica"


_XLA_RANDOM = ("XLA draws other numbers than TensorFlow's kernels from the same stateless seed "
               "(its normal transform, and auto_select's algorithm): the noise differs from "
               "1 replica's, not within a run")


# Not a replica count: the same 1 replica under another strategy. A resume from the default
# strategy on one_device is not refused either; trainer/state/elastic.py logs "the same
# replica count, the same trajectory (bit for bit)", which is wrong for this Task (measured
# 1.3e-3 at step 40 after 20 steps on each, 2026-11-28; reported on issue 44).
_GENERATOR_STRATEGY = ("a tf.random.Generator made under a distribution strategy (one_device "
                       "included) hashes the replica id into its key, under the default one it "
                       "does not (TensorFlow): another stream on the same 1 replica; "
                       "step.normal does not depend on the strategy")


_XLA_ROTATION = ("RandomRotation's ImageProjectiveTransformV3 has no XLA kernel: whole-step "
                 "XLA cannot compile the step (TensorFlow's limit; the run fails its first loop)")


def _within(tolerance: float) -> dict:
  """agree_within: `tolerance` on every shape."""
  return {"2": tolerance, "central_storage-2": tolerance, "xla-1": tolerance}


def _on_two_replicas(why: str) -> dict:
  """Not applicable: agreement with 1 replica on the shapes of 2 (XLA's 1 still agrees)."""
  return {("shapes_agree", "2"): why, ("shapes_agree", "central_storage-2"): why}


def _refused_on_two_replicas(because: str, refusal: str) -> dict:
  """shapes_agree not applicable on the shapes of 2, only because distloop refuses to mix
  replica counts for the workload (`refuses_elastic`): the elastic check asserts that."""
  return _on_two_replicas(f"{because}: 1 and 2 replicas train different models by design, and "
                          f"distloop refuses to resume one on the other ({refusal!r}), as the "
                          f"elastic check asserts")

# `agree_within`: measured 2026-11-28 on the 2-core machine (the largest difference from 1
# replica after 40 plain-SGD steps), x ~2; every other cell measured <= 3e-8 (XLA: 6e-8).
CATALOGUE = [
    # The built-in supervised step: the CNN on synthetic MNIST-shaped data.
    Workload("cnn", ("--config=synthetic", "--config.model.conv_filters=8",
                     "--config.model.dense_units=16", *SGD),
             served=_served_cnn, donor="softmax_head"),
    # A Keras model whose last layer is a softmax (probabilities, no second softmax).
    Workload("softmax_head", ("--config=synthetic",
                              "--config.model.name=tests.keras_plugins:softmax_head",
                              "--config.data.name=tests.keras_plugins:four_classes", *SGD),
             served=_served_softmax),
    Workload("conv_batchnorm", ("--config=synthetic",
                                "--config.model.name=tests.batchnorm_plugins:conv_batchnorm",
                                "--config.data.name=tests.batchnorm_plugins:images", *SGD),
             served=_served_batchnorm,
             agree_within={"xla-1": 2e-6},  # measured 6.4e-7: XLA fuses the normalization
             refuses_elastic=_BATCHNORM_REFUSAL,
             not_applicable=_refused_on_two_replicas(_BATCHNORM_REPLICAS, _BATCHNORM_REFUSAL)),
    Workload("two_heads", ("--config=synthetic",
                           "--config.model.name=tests.multi_output_plugins:two_heads",
                           "--config.data.name=tests.multi_output_plugins:arrays",
                           "--config.train.loss=class=sparse_categorical_crossentropy,"
                           "value=mean_squared_error",
                           "--config.train.loss_weights=value=0.5",
                           "--config.eval.metrics=class=accuracy", *SGD),
             served=_served_two_heads, eval_examples=1000,
             agree_within=_within(2e-7)),  # measured 6.0e-8 (2, central_storage), 7.5e-8 (XLA)
    # Token sequences of 5..200, each replica's batch padded to its own longest (length
    # grouping off), Embedding(mask_zero) -> masked mean: each replica's sparse gradient
    # has its own row count, and repeats tokens. Clipped
    # by global norm (binding on every step), so a norm that counts a repeated row twice
    # shows too.
    Workload("variable_length", ("--config=synthetic",
                                 "--config.model.name=tests.sequence_plugins:masked_mean",
                                 "--config.data.name=tests.sequence_plugins:numpy_sequences",
                                 "--config.data.pad_to=longest",
                                 "--config.data.bucket_window=0",
                                 "--config.train.clip_grad_norm=0.05", *SGD),
             served=_served_sequences),
    # The same tokens into a GRU whose Input takes its shape from input_spec, grouped by
    # length (data.bucket_window's default) and padded up to bucket boundaries: every replica
    # padded to the global batch's boundary (4 lengths: whole-step XLA compiles 4 steps, not
    # one per batch as `longest` would make it).
    Workload("variable_length_gru",
             ("--config=synthetic", "--config.model.name=tests.guarantees.workloads:embedding_gru",
              "--config.data.name=tests.sequence_plugins:numpy_sequences",
              "--config.data.pad_to=50,100,150,200", *SGD),
             served=_served_sequences,
             refuses_change=("length grouping (data.bucket_window) fixes the batches: a "
                             "resume cannot change train.global_batch_size")),
    # examples/gan.py: two models, two optimizers, noise from step.normal.
    Workload("gan", (f"--config={_GAN}", *SGD), served=_served_gan,
             not_applicable={("shapes_agree", "xla-1"): _XLA_RANDOM}),
    # A Task's own variables: a step counter and moving averages the step assigns.
    Workload("task_counter", ("--config=synthetic",
                              "--config.train.task=tests.guarantees.workloads:Counter", *SGD),
             served=_served_logits),
    # A trained layer held as an attribute and a tf.random.Generator.
    Workload("task_layer_generator",
             ("--config=synthetic",
              "--config.train.task=tests.guarantees.workloads:LayerAndGenerator", *SGD),
             refuses_elastic=_GENERATOR_REFUSAL,
             not_applicable={**_refused_on_two_replicas(_GENERATOR_REPLICAS, _GENERATOR_REFUSAL),
                             ("shapes_agree", "xla-1"): _XLA_RANDOM,
                             ("order", "one_device-of-2"): _GENERATOR_STRATEGY}),
    # step.all_gather (global negatives) and step.example_seeds (per-example augmentation)
    Workload("contrastive", ("--config=synthetic",
                             "--config.train.task=tests.contrastive_plugins:Contrastive", *SGD),
             evaluates=False,
             agree_within=_within(2e-7),  # measured 6.7e-8 (2, central_storage)
             not_applicable={("shapes_agree", "xla-1"): _XLA_RANDOM,
                             "eval": "Contrastive has no eval_step: --mode=eval refuses it "
                                     "(tests/test_task_without_eval.py)"},
             # Its flips are drawn per example (seeds from step.example_seeds, as that
             # method's docstring shows): 1 = 2 replicas holds (6.7e-8 above), and so does
             # its elastic resume.
             ),
    # The built-in MLP (Dropout 0.2), a Keras random layer drawn per example: the same masks
    # on any replica count (trainer/task/randomness.py).
    Workload("dropout_mlp", ("--config=synthetic", "--config.model.name=mlp", *SGD),
             served=_served_cnn,  # measured 3.0e-8 (2, central_storage): AGREE_DEFAULT
             not_applicable={("shapes_agree", "xla-1"): _XLA_RANDOM}),  # measured 7.3e-3
    # RandomFlip + RandomRotation on the images, a Conv and Dropout: each example's flip,
    # angle and mask its own on any replica count.
    Workload("augmented", ("--config=synthetic",
                           "--config.model.name=tests.shape_plugins:augmented", *SGD),
             served=_served_cnn,
             # measured 4.2e-7 (2, central_storage); elastic 1.7e-7
             agree_within={"2": 8e-7, "central_storage-2": 8e-7},
             not_applicable={(EVERY_CHECK, "xla-1"): _XLA_ROTATION}),
    # conv_batchnorm with synchronized=True: the global batch's statistics on every shape.
    Workload("conv_batchnorm_synchronized",
             ("--config=synthetic",
              "--config.model.name=tests.batchnorm_plugins:conv_batchnorm_synchronized",
              "--config.data.name=tests.batchnorm_plugins:images", *SGD),
             served=_served_batchnorm,
             # measured 1.6e-6 (2, central_storage; elastic 1.5e-6), 7.8e-7 (XLA): Keras's
             # synchronized moments take the variance as E(x^2) - E(x)^2 of sums over 32x32
             # positions, which cancel; still 4000x below the unsynchronized model's 6.5e-3
             agree_within={**_within(3e-6), "xla-1": 1.6e-6}),
    Workload("adamw_ema_accumulation",
             ("--config=synthetic", "--config.model.conv_filters=6",
              "--config.model.dense_units=16", "--config.train.optimizer=adamw",
              "--config.train.learning_rate=0.005", "--config.train.ema_decay=0.9",
              "--config.train.accumulation_steps=2"),
             served=_served_cnn, sgd_flags=SGD,
             # measured 6.7e-8 (2, central_storage), 1.2e-7 (XLA)
             agree_within={**_within(2e-7), "xla-1": 3e-7}),
]
BY_NAME = {workload.name: workload for workload in CATALOGUE}
