"""train.epochs: a run's length in passes over the training split, instead of train.steps.

The data stream is counted in examples (position p is epoch p // N of an N-example
split: input_pipelines/order.py), so E epochs are E * N examples: ceil(E * N /
global batch) steps, derived once the split is loaded and said in the start-up log.
The run then goes on as one of that many train.steps: the resolved config (what
config.json records and a resume compares) holds the steps, train.epochs 0. An epoch
needs a split of known size: a tf.data stream's is not, and is refused.

The fractional epoch a step reached (examples used / N) is reported next to the
step: the progress line, TensorBoard's train scalars, metrics.csv.
"""
import copy
import math

from absl import logging

from trainer.errors import UserError


def one_length(config, *, overridden: set[str]) -> None:
  """The command line's length replaces the config file's: `--config.train.epochs=5` on a
  config that sets train.steps trains 5 epochs (and `--config.train.steps=N` on one that
  sets train.epochs, N steps). Both on the command line, or both in the file: check_config
  refuses them."""
  train = config.train
  if "train.epochs" in overridden and "train.steps" not in overridden and train.epochs:
    if train.steps:
      logging.info("--config.train.epochs=%g replaces the config's train.steps=%d",
                   train.epochs, train.steps)
    train.steps = 0
  elif "train.steps" in overridden and "train.epochs" not in overridden and train.steps:
    if train.epochs:
      logging.info("--config.train.steps=%d replaces the config's train.epochs=%g",
                   train.steps, train.epochs)
    train.epochs = 0.0


def check_config(config) -> None:
  """Start-up (no data yet): train.epochs >= 0, and not given together with train.steps."""
  epochs, steps = config.train.epochs, config.train.steps
  if epochs < 0:
    raise UserError(f"train.epochs={epochs:g} must be >= 0 (0: the run's length is train.steps)")
  if epochs and steps:
    raise UserError(f"train.epochs={epochs:g} and train.steps={steps} are both set: give one "
                    f"(on the command line, either one replaces the config file's)")


def resolved(config, train_split):
  """`config` with train.steps derived from train.epochs (a copy; unchanged without it)."""
  epochs = config.train.epochs
  if not epochs:
    return config
  size = num_examples(train_split)
  if size is None:
    raise UserError(f"train.epochs={epochs:g} needs a training split of known size; "
                    f"{train_split.where} is a tf.data stream: give train.steps instead")
  batch = config.train.global_batch_size
  steps = math.ceil(epochs * size / batch - 1e-9)  # 1.1 * 100 / 10: 11.000000000000002
  config = copy.deepcopy(config)  # the caller's stays as given (a Python caller reuses it)
  config.train.steps, config.train.epochs = steps, 0.0
  if config.train.lr_schedule == "cosine" and config.train.warmup_steps >= steps:
    raise UserError(f"train.warmup_steps={config.train.warmup_steps} must be below the "
                    f"{steps} steps of train.epochs={epochs:g}")
  logging.info("train.epochs=%g: %d steps (%d training examples, global batch %d: %.4g steps "
               "per epoch)", epochs, steps, size, batch, size / batch)
  return config


def num_examples(split) -> int | None:
  """The size of a split; None for a tf.data stream."""
  try:
    return len(split)
  except TypeError:
    return None


def epoch(examples: int, size: int | None) -> float | None:
  """The fractional epoch after `examples` examples of a `size`-example split."""
  return examples / size if size else None

