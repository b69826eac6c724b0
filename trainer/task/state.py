"""What a built Task holds, sorted and keyed for checkpoints: `TaskState`.

Models, optimizers and extra variables come from `task.state()` (its attributes
by default); float16 adds a loss scale per optimizer. The keys come from
trainer/task/keys.py and do not depend on Keras's per-process numbering.
"""
import keras
import numpy as np

from trainer.task import keys
from trainer.task import loss_scale as loss_scales
from trainer.task import optimizers as optimizer_rules
from trainer.errors import UserError


class TaskState:
  """Create inside `strategy.scope()`, after task.build()."""

  def __init__(self, task, *, float16: bool):
    held = task.state()
    if not isinstance(held, dict):
      raise UserError(f"{type(task).__name__}.state() returned {type(held).__name__}, not a "
                      f"dict of models, optimizers and variables")
    models = [v for v in held.values() if isinstance(v, keras.Model)]
    optimizers = [v for v in held.values() if isinstance(v, keras.optimizers.Optimizer)]
    extra = {name: v for name, v in held.items() if keys.is_variable(v)}
    if not models and not extra:
      raise UserError(f"{type(task).__name__} holds no model or variable after build(): "
                      f"keep them as attributes (self.model = ...) or return them from state()")
    for optimizer in optimizers:
      if not optimizer.built:
        raise UserError(f"{type(task).__name__}'s optimizer {optimizer.name!r} is not built: "
                        f"call optimizer.build(variables) in build()")
    self.models = keys.model_names(models)
    self.optimizers = keys.optimizer_names(optimizers)
    for name, optimizer in self.optimizers.items():  # a Task's own ones too
      optimizer_rules.check_supported(optimizer, f"{type(task).__name__}'s optimizer {name!r}")
    # float16: one dynamic loss scale per optimizer (its updates skip on overflow alone).
    self.loss_scales = {id(optimizer): loss_scales.DynamicLossScale() if float16 else None
                        for optimizer in optimizers}
    model_keys = keys.model_variables(self.models)
    self.model_variables = {**model_keys, **keys.extra_variables(extra)}
    self.optimizer_variables = keys.optimizer_variables(self.optimizers, model_keys)
    for name, optimizer in self.optimizers.items():
      scale = self.loss_scales[id(optimizer)]
      if scale is not None:
        self.optimizer_variables.update({f"loss_scale/{name}/{key.split('/')[-1]}": variable
                                         for key, variable in scale.variables().items()})

  def all_variables(self) -> list:
    return [*self.model_variables.values(), *self.optimizer_variables.values()]

  def describe(self) -> list[str]:
    """For the start-up log and TensorBoard: every model's parameter count, every
    optimizer with its weight decay."""
    lines = []
    for name, model in self.models.items():
      trainable = sum(int(np.prod(v.shape)) for v in model.trainable_variables)
      frozen = sum(int(np.prod(v.shape)) for v in model.non_trainable_variables)
      lines.append(f"model {name}: {trainable + frozen:,} parameters ({trainable:,} trainable, "
                   f"{frozen:,} not)")
    for name, optimizer in self.optimizers.items():
      updated = getattr(optimizer, "_trainable_variables", [])
      lines.append(f"optimizer {name}: {optimizer_rules.describe(optimizer, updated)}")
    return lines

  def averaged_weights(self):
    """A context: the moving averages (use_ema) in place of the weights they average."""
    return optimizer_rules.averaged_weights(list(self.optimizers.values()))

  def learning_rates(self) -> dict:
    """{"learning_rate": the rate of the next step} (one optimizer) or one per optimizer."""
    if len(self.optimizers) == 1:
      (optimizer,) = self.optimizers.values()
      return {"learning_rate": float(optimizer.learning_rate.numpy())}
    return {f"learning_rate_{name}": float(optimizer.learning_rate.numpy())
            for name, optimizer in self.optimizers.items()}
