"""The training flow, top to bottom: `Trainer.train()`.

Who owns what: the Trainer owns the model, the optimizer and the order of the
periodic work; trainer/steps.py owns what runs compiled; input_pipelines owns
the data position (a pure function of seed and step); trainer/checkpoints.py owns
the disk format. Every write happens on the chief only.
"""
import dataclasses
import math
import os
import time

from absl import logging
import ml_collections
import tensorflow as tf

import models
from input_pipelines import batching
from input_pipelines.splits import Splits
from trainer import checkpoints
from trainer import export
from trainer import optimizers
from trainer import outputs
from trainer import periodic
from trainer import runtime
from trainer import steps
from trainer import summaries
from trainer.errors import NonFiniteError


@dataclasses.dataclass
class _Throughput:
  """Steady-state examples/s: the first loop of a process (it traces) is kept apart."""
  first_examples: int = 0
  first_seconds: float = 0.0
  steady_examples: int = 0
  steady_seconds: float = 0.0

  def add(self, examples: int, seconds: float) -> None:
    if self.first_seconds == 0.0:
      self.first_examples, self.first_seconds = examples, seconds
    else:
      self.steady_examples += examples
      self.steady_seconds += seconds

  def per_second(self) -> float:
    """Steady throughput; the first loop's only when it was the only one."""
    if self.steady_seconds > 0:
      return self.steady_examples / self.steady_seconds
    return self.first_examples / self.first_seconds if self.first_seconds > 0 else 0.0

  @property
  def seconds(self) -> float:
    return self.first_seconds + self.steady_seconds


class Trainer:
  """Trains, evaluates and exports one model in one model_dir.

      step = latest checkpoint's step, or 0 (weights and optimizer restored)
      batches = the global batch sequence from `step` on
      while step < train.steps:
          n = steps to the next boundary: steps_per_loop, checkpoint, eval or the end
          train_loop(batches, n)          # compiled: n steps, no Python in between
          step += n
          read metrics once; log; TensorBoard; stop on a non-finite loss
          evaluate if due; checkpoint if due (async)
      wait for saves; export; summary.json

  Constructing a Trainer builds the model and optimizer under the strategy;
  it reads and writes nothing.
  """

  def __init__(self, config: ml_collections.ConfigDict, model_dir: str,
               strategy: tf.distribute.Strategy, splits: Splits):
    self.config = config
    self.model_dir = model_dir
    self.strategy = strategy
    self.splits = splits
    self.is_chief = runtime.is_chief(strategy)
    with strategy.scope():
      self.model = models.build(config.model)
      self.optimizer = optimizers.create(config.train)
      self.optimizer.build(self.model.trainable_variables)
      self._train_metrics = steps.MetricSums("train")
      self._eval_metrics = steps.MetricSums("eval")
    self.checkpoints = checkpoints.Checkpoints(
        outputs.checkpoint_dir(model_dir), max_to_keep=config.checkpoint.max_to_keep,
        async_save=config.checkpoint.async_save, writer=self.is_chief)
    self.summaries = summaries.Summaries(model_dir, enabled=self.is_chief)
    self._train_loop = steps.make_train_loop(
        strategy, self.model, self.optimizer, self._train_metrics,
        global_batch_size=config.train.global_batch_size,
        communication_options=runtime.communication_options(config.runtime))
    self._eval_pass = None  # built on first use: the eval data is distributed once
    self._eval_seconds = 0.0
    self._checkpoint_seconds = 0.0

  # -- the flow ---------------------------------------------------------------

  def train(self, *, eval_interval: int) -> dict:
    """Trains to train.steps, evaluating every `eval_interval` steps (0: at the end only)."""
    started = time.perf_counter()
    config = self.config
    total = config.train.steps
    batch_size = config.train.global_batch_size

    step = self.restore_latest()  # refuses a model_dir of another model before any write
    if self.is_chief:
      outputs.write_json(outputs.config_path(self.model_dir), config.to_dict())
    checkpoint_due = periodic.Every(config.checkpoint.interval, total)
    eval_due = periodic.Every(eval_interval, total)
    logging.info("Training %s on %s with %d replica(s) (%s) from step %d to %d.",
                 config.model.name, config.data.name, self.strategy.num_replicas_in_sync,
                 config.runtime.strategy, step, total)

    dataset = batching.train_dataset(self.splits, seed=config.runtime.seed,
                                     global_batch_size=batch_size, start_step=step)
    batches = iter(self.strategy.experimental_distribute_dataset(dataset))
    throughput = _Throughput()
    train_metrics, eval_metrics = {}, None
    while step < total:
      num_steps = min(config.train.steps_per_loop, total - step,
                      checkpoint_due.next_due(step) - step, eval_due.next_due(step) - step)
      self._train_metrics.reset()
      loop_start = time.perf_counter()
      self._train_loop(batches, tf.constant(num_steps))
      train_metrics = self._train_metrics.result()  # host sync: waits for the n steps
      loop_seconds = time.perf_counter() - loop_start
      first_step, step = step + 1, step + num_steps
      if not math.isfinite(train_metrics["loss"]):
        raise NonFiniteError(
            f"non-finite loss ({train_metrics['loss']}) in steps {first_step}..{step}; "
            f"stopped without saving them ({self._last_checkpoint()})")
      throughput.add(num_steps * batch_size, loop_seconds)
      examples_per_sec = num_steps * batch_size / loop_seconds
      self.summaries.scalars("train", step, {
          "loss": train_metrics["loss"], "accuracy": train_metrics["accuracy"],
          "learning_rate": float(self.optimizer.learning_rate.numpy()),
          "examples_per_sec": examples_per_sec})
      logging.info("step %d/%d | loss %.4f | accuracy %.4f | %.0f examples/s | ETA %s",
                   step, total, train_metrics["loss"], train_metrics["accuracy"],
                   examples_per_sec, _eta(total - step, loop_seconds / num_steps))
      if eval_due.due(step):
        eval_metrics = self.evaluate(step)
      if checkpoint_due.due(step):
        self.save(step)

    self.checkpoints.wait()  # the final step is on disk before anything reports it
    if eval_metrics is None:  # resumed at the final step: nothing trained, still report
      eval_metrics = self.evaluate(step)
    self.export(step)
    summary = {
        "step": step,
        "train_loss": train_metrics.get("loss"),
        "train_accuracy": train_metrics.get("accuracy"),
        "eval_loss": eval_metrics["loss"],
        "eval_accuracy": eval_metrics["accuracy"],
        "eval_examples": eval_metrics["examples"],
        "examples_per_sec": throughput.per_second(),
        "num_replicas": self.strategy.num_replicas_in_sync,
        "strategy": config.runtime.strategy,
        "wall_time_sec": time.perf_counter() - started,
        "train_time_sec": throughput.seconds,
        "eval_time_sec": self._eval_seconds,
        "checkpoint_time_sec": self._checkpoint_seconds,
    }
    if self.is_chief:
      outputs.write_json(outputs.summary_path(self.model_dir), summary)
    self.summaries.close()
    return summary

  # -- the periodic work --------------------------------------------------------

  def evaluate(self, step: int) -> dict:
    """Loss and accuracy over every test example exactly once."""
    start = time.perf_counter()
    if self._eval_pass is None:
      dataset = batching.eval_dataset(self.splits,
                                      global_batch_size=self.config.eval.global_batch_size)
      self._eval_pass = steps.make_eval_pass(
          self.strategy, self.model, self._eval_metrics,
          self.strategy.experimental_distribute_dataset(dataset))
    self._eval_metrics.reset()
    self._eval_pass()
    result = self._eval_metrics.result()  # host sync
    self.summaries.scalars("eval", step, {"loss": result["loss"], "accuracy": result["accuracy"]})
    self.summaries.flush()
    self._eval_seconds += time.perf_counter() - start
    logging.info("eval at step %d | loss %.4f | accuracy %.4f | %d examples",
                 step, result["loss"], result["accuracy"], result["examples"])
    return result

  def save(self, step: int) -> None:
    """Starts an async checkpoint of `step`; refuses non-finite weights."""
    model_tree = checkpoints.variables_tree(checkpoints.model_variables(self.model))
    bad = checkpoints.non_finite_keys(model_tree)
    if bad:  # the loss is computed before each update, so check the weights themselves
      raise NonFiniteError(f"weights became non-finite by step {step} ({bad[0]}); "
                           f"not saved ({self._last_checkpoint()})")
    blocked = self.checkpoints.save(
        step, model_tree,
        checkpoints.variables_tree(checkpoints.optimizer_variables(self.optimizer)),
        {"step": step, "config": self.config.to_dict()})
    self._checkpoint_seconds += blocked
    logging.info("checkpoint at step %d started (blocked training %.3fs)", step, blocked)

  def restore_latest(self) -> int:
    """Loads the latest checkpoint into the model and optimizer; returns its step (0: none)."""
    step = self.checkpoints.latest_step()
    if step is None:
      return 0
    model_variables = checkpoints.model_variables(self.model)
    optimizer_variables = checkpoints.optimizer_variables(self.optimizer)
    model_tree, optimizer_tree, _ = self.checkpoints.restore(
        step, checkpoints.variables_tree(model_variables),
        checkpoints.variables_tree(optimizer_variables))
    checkpoints.assign_tree(model_variables, model_tree)
    checkpoints.assign_tree(optimizer_variables, optimizer_tree)
    logging.info("Restored checkpoint at step %d from %s", step, self.checkpoints.directory)
    return step

  def export(self, step: int) -> str | None:
    """SavedModel of the current weights at export/<step>/ (kept if it already exists)."""
    destination = export.export_dir(self.model_dir, step)
    if not self.is_chief or os.path.isdir(destination):
      return destination
    export.export_saved_model(
        self.config.model, checkpoints.variables_tree(checkpoints.model_variables(self.model)),
        destination)
    logging.info("Exported SavedModel to %s", destination)
    return destination

  def _last_checkpoint(self) -> str:
    step = self.checkpoints.latest_step()
    return "no checkpoint yet" if step is None else f"the last checkpoint is step {step}"

  def close(self) -> None:
    self.checkpoints.wait()
    self.checkpoints.close()
    self.summaries.close()


def _eta(remaining_steps: int, seconds_per_step: float) -> str:
  seconds = int(remaining_steps * seconds_per_step)
  return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
