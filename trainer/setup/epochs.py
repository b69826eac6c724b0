"""train.epochs: a run's length in passes over the training split, instead of train.steps.

The data stream is counted in examples (position p is epoch p // N of an N-example
split: input_pipelines/order.py), so E epochs are E * N examples, and the run's steps
are derived in examples too, once the split is loaded and said in the start-up log: a
fresh run takes ceil(E * N / global batch) steps; a resumed one goes on from the data
position its newest checkpoint recorded (step s, x examples used: `examples_consumed`)
with ceil((E * N - x) / global batch) more, so a run whose batch size changed between
runs still ends at E epochs, not at E epochs of the new batch counted from step 0.
When the batch does not divide what is left, the last step completes the epoch (it ends
up to one batch minus one example past E * N; the log says where). The run then goes on
as one of that many train.steps: the resolved config (what config.json records and a
resume compares) holds the steps, train.epochs 0. An epoch needs a split of known size:
a tf.data stream's is not, and is refused.

The fractional epoch a step reached (examples used / N) is reported next to the
step: the progress line, TensorBoard's train scalars, metrics.csv.
"""
import copy
import dataclasses
import math
from typing import Callable

from absl import logging

from trainer.errors import UserError

# The most examples a run may count: exact in a float and in the int64 data position.
_MAX_EXAMPLES = 2**53
_replaced: str | None = None  # one_length's note, said by say_replaced


def one_length(config, *, overridden: set[str]) -> None:
  """The command line's length replaces the config file's: `--config.train.epochs=5` on a
  config that sets train.steps trains 5 epochs (and `--config.train.steps=N` on one that
  sets train.epochs, N steps). Both on the command line, or both in the file: check_config
  refuses them. A train.epochs no run can have is refused first; the line saying what
  replaced what waits for `say_replaced` (past the refusals: a refusal is one line)."""
  global _replaced
  train = config.train
  check_value(train.epochs)
  if "train.epochs" in overridden and "train.steps" not in overridden and train.epochs:
    if train.steps:
      _replaced = (f"--config.train.epochs={train.epochs:g} replaces the config's "
                   f"train.steps={train.steps}")
    train.steps = 0
  elif "train.steps" in overridden and "train.epochs" not in overridden and train.steps:
    if train.epochs:
      _replaced = (f"--config.train.steps={train.steps} replaces the config's "
                   f"train.epochs={train.epochs:g}")
    train.epochs = 0.0


def say_replaced() -> None:
  """Logs what one_length replaced, once the config and the data passed their checks."""
  global _replaced
  if _replaced:
    logging.info("%s", _replaced)
  _replaced = None


def check_value(epochs) -> None:
  """train.epochs is a finite number >= 0 and countable: NaN, an infinity, a negative or a
  huge count of passes makes no run (math.ceil of them raised ValueError/OverflowError,
  a traceback)."""
  if isinstance(epochs, bool) or not isinstance(epochs, (int, float)):
    raise UserError(f"train.epochs={epochs!r} must be a number of passes over the training "
                    f"split (0: the run's length is train.steps)")
  if not math.isfinite(epochs) or epochs < 0:
    raise UserError(f"train.epochs={epochs:g} must be a finite number >= 0 (0: the run's "
                    f"length is train.steps)")
  if epochs >= _MAX_EXAMPLES:  # whatever the split's size: at least one example an epoch
    raise UserError(f"train.epochs={epochs:g} is more passes than distloop can count "
                    f"(below {_MAX_EXAMPLES:.3g} examples in all)")


def check_config(config) -> None:
  """Start-up (no data yet): train.epochs finite and >= 0, and not given together with
  train.steps."""
  epochs, steps = config.train.epochs, config.train.steps
  check_value(epochs)
  if epochs and steps:
    raise UserError(f"train.epochs={epochs:g} and train.steps={steps} are both set: give one "
                    f"(on the command line, either one replaces the config file's)")


@dataclasses.dataclass(frozen=True)
class Plan:
  """train.epochs as a count of examples: the run ends at the first step whose data
  position reaches `target` (E * N, rounded up to a whole example)."""
  epochs: float
  size: int    # N: the training split's examples
  batch: int   # the global batch of this run
  target: int  # examples the run's epochs make

  def final_step(self, step: int, examples: int) -> int:
    """The last step of a run at `step` with `examples` used: whole batches until the
    target is reached (the last one completes it); `step` itself once it is."""
    return step + max(0, -(-(self.target - examples) // self.batch))

  def check_restored(self, step: int, examples: int, steps: int, *,
                     any_worker: Callable[[bool], bool]) -> None:
    """The `steps` of the run were counted at start-up from the newest checkpoint's data
    position (its meta, read as JSON). A restore that fell back to an older step (the
    newest unreadable, now set aside: `step`, `examples` used) whose data position makes
    other steps at this batch would end the run off its epochs, or its schedules off
    their length: refused, and the next run counts from the step restored.
    `any_worker(refused)`: agreed, every worker stops (trainer/cluster/agreement.py)."""
    if any_worker(self.final_step(step, examples) != steps):
      raise UserError(
          f"train.epochs={self.epochs:g} made {steps} steps from the newest checkpoint, but "
          f"training resumed from step {step} ({examples} examples used), where they make "
          f"{self.final_step(step, examples)}: run again to count them from step {step}")


def plan(config, train_split) -> Plan | None:
  """train.epochs in examples (None without it). Refuses a split of unknown size (a
  tf.data stream) and an epoch count too large to count in examples."""
  epochs = config.train.epochs
  if not epochs:
    return None
  size = num_examples(train_split)
  if size is None:
    raise UserError(f"train.epochs={epochs:g} needs a training split of known size; "
                    f"{train_split.where} is a tf.data stream: give train.steps instead")
  examples = epochs * size
  if not examples < _MAX_EXAMPLES:
    raise UserError(f"train.epochs={epochs:g} is {examples:.3g} examples of the {size}-example "
                    f"training split: more than the {_MAX_EXAMPLES:.3g} distloop can count")
  nearest = round(examples)  # 1.1 * 100: 110.00000000000001 examples are 110
  target = nearest if abs(examples - nearest) <= 1e-9 * max(1.0, examples) else math.ceil(examples)
  return Plan(epochs, size, config.train.global_batch_size, target)


def resolved(config, epoch_plan: Plan, start: tuple[int, int] | None = None):
  """`config` with train.steps derived from train.epochs' `epoch_plan` (a copy).

  `start`: (step, examples used) of the newest checkpoint, where a resume goes on from
  (None: step 0). The steps left are counted from its data position, in this run's
  batch: the examples an earlier run used at another batch size count as used.
  """
  step, used = start or (0, 0)
  steps = epoch_plan.final_step(step, used)
  config = copy.deepcopy(config)  # the caller's stays as given (a Python caller reuses it)
  config.train.steps, config.train.epochs = steps, 0.0
  if config.train.lr_schedule == "cosine" and config.train.warmup_steps >= steps:
    raise UserError(f"train.warmup_steps={config.train.warmup_steps} must be below the "
                    f"{steps} steps of train.epochs={epoch_plan.epochs:g}")
  say_replaced()
  logging.info("%s", describe(epoch_plan, step, used, steps))
  return config


def describe(epoch_plan: Plan, step: int, used: int, steps: int) -> str:
  """The start-up line: how many steps the epochs make, from where, and where they end."""
  epochs, size, batch = epoch_plan.epochs, epoch_plan.size, epoch_plan.batch
  ends = used + (steps - step) * batch
  if not step and not used:
    line = (f"train.epochs={epochs:g}: {steps} steps ({size} training examples, global batch "
            f"{batch}: {size / batch:.4g} steps per epoch)")
  elif steps == step:
    return (f"train.epochs={epochs:g}: the checkpoint at step {step} has used {used} examples "
            f"(epoch {used / size:.4g}) of the {epoch_plan.target} they make: no step left")
  else:
    line = (f"train.epochs={epochs:g}: {steps} steps: from step {step} ({used} examples used, "
            f"epoch {used / size:.4g}), {steps - step} more of global batch {batch} to "
            f"{epoch_plan.target} examples ({size} training examples)")
  if ends > epoch_plan.target:
    line += (f"; the last step is a whole batch: it completes the epochs and ends "
             f"{ends - epoch_plan.target} example(s) past them (epoch {ends / size:.4g})")
  return line


def num_examples(split) -> int | None:
  """The size of a split; None for a tf.data stream."""
  try:
    return len(split)
  except TypeError:
    return None


def epoch(examples: int, size: int | None) -> float | None:
  """The fractional epoch after `examples` examples of a `size`-example split."""
  return examples / size if size else None

