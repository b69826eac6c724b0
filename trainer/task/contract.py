"""The Task contract: what one step does. distloop decides when, and keeps the guarantees.

A Task builds its models, optimizers and extra state (`build`), says what one
training step does on this replica's share of a global batch (`train_step`),
what one eval batch measures (`eval_step`), and what to export (`export`).
distloop runs the steps compiled, `train.steps_per_loop` at a time, on any
strategy, and owns everything around them:

- the reduction: `step.minimize` / `step.apply_gradients` all-reduce each
  gradient exactly once (a Task never calls Keras's `optimizer.apply`, which
  would all-reduce a second time), from a loss divided by the global batch
  (`step.replica_loss`), with float16 loss scaling per optimizer and
  `train.clip_grad_norm` after the reduction;
- the state: every model, layer, optimizer (its slots and step count), variable,
  metric and random generator the task holds (attributes, at any depth of dicts,
  lists and tuples, or what `state()` returns) is checkpointed by orbax under keys
  that do not depend on Keras's per-process numbering, and restored exactly. The
  traced steps are the ground truth: a variable they read or write that no
  checkpoint would hold, a variable they create, or randomness with a hidden state
  (`tf.random.normal`) is refused at start-up; randomness drawn with `step.normal`
  / `step.uniform` / `step.seed` is a stateless function of (runtime.seed, step),
  so a resumed run draws the same;
- the metrics: each value `train_step` / `eval_step` returns is per example
  (shape [batch]) or per step (a scalar); distloop sums them and divides once by
  the example count, so train_<name> and eval_<name> are exact means for any
  replica count and any partial eval batch; a per-step scalar must be the same on
  every replica (a learning rate, a counter, a value of `step.all_gather`): train_step's
  are compared once per loop, and one that differs stops the run in one line;
- preemption (exit 42 with the step on disk), SIGKILL safety, rollback on
  non-finite values, multi-worker agreement, XLA and mixed precision.

    class Task:
      def build(self, context: BuildContext) -> None       # models, optimizers, state
      def train_step(self, batch, step: StepContext) -> dict[str, Tensor]
      def eval_step(self, batch) -> dict[str, Tensor]      # optional: {} = no eval
      def predict_step(self, batch, step) -> dict[str, Tensor]  # optional: default export()'s
      def export(self) -> Export | None                    # optional
      def state(self) -> dict                              # optional: what it holds by default

`batch` is what the data plug-in delivers: (features, labels), this replica's
share. The built-in supervised step (trainer/supervised/task.py) is a Task like
any other; examples/gan.py and examples/distillation.py are two more.
"""
import dataclasses
from typing import Any, Callable

import keras


@dataclasses.dataclass
class Export:
  """What `--mode=export` (and the end of training) writes as a SavedModel.

  `model` is served as `serving_default`: inputs from `input_spec` (a TensorSpec
  or a dict of them, batch dimension None; default: the data's features), the
  output `{output_name: transform(model(inputs))}`, or `transform`'s dict as it is
  (several named outputs). The SavedModel holds a plain
  copy of the model (no strategy): `build(input_spec)` makes a fresh one when
  given, else keras.models.clone_model (a subclassed model without `build`
  is saved as it is).
  """
  model: keras.Model
  output_name: str | None = "predictions"
  transform: Callable | None = None
  input_spec: Any = None
  build: Callable | None = None


class Task:
  """Subclass it; see the module docstring. `context.config` is the run's config.

  `run_fixing_fields`: which fields of the Task's own config sections (sections a
  user's config adds, e.g. `gan`) fix the run, {section: (field, ...)}: a resume
  refuses a change to those, and lets the section's other fields change (its own
  optimizer's learning rate, a loss weight), logging each change. None (the default):
  every field of every added section fixes the run (trainer/setup/run_fields.py).
  """

  run_fixing_fields: dict | None = None

  def build(self, context) -> None:
    raise NotImplementedError("a Task builds its models and optimizers in build()")

  def train_step(self, batch, step) -> dict:
    raise NotImplementedError("a Task says what one training step does in train_step()")

  def eval_step(self, batch) -> dict:
    """Named per-example values on one eval batch (no side effects); {}: no eval."""
    del batch
    return {}

  def predict_step(self, batch, step) -> dict:
    """`--mode=predict`: named per-example values of one batch, each a column of the
    predictions (docs/predict.md). `step` is a PredictContext: `step.rows` (the examples'
    indices), `step.normal` / `step.uniform` / `step.example_seeds` (a function of the
    row). Not overridden: the columns are what export() serves."""
    del batch, step
    return {}

  def export(self) -> Export | None:
    """What to serve; None: nothing is exported."""
    return None

  def state(self) -> dict:
    """{name: what to checkpoint}. By default everything the task holds, at any depth of
    dicts, lists and tuples: models, layers, optimizers, variables, metrics and random
    generators (trainer/state/task_state.py walks what this returns and keys each)."""
    return {name: value for name, value in vars(self).items() if not name.startswith("__")}
