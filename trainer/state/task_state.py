"""What a built Task holds, sorted and keyed for checkpoints: `TaskState`; and the check
that it is everything the task's traced steps use.

What is held comes from `task.state()`: by default everything the task holds
(`held`: attributes, at any depth of dicts, lists and tuples) that has state: models,
layers, optimizers, variables, metrics, a `tf.random.Generator` or a Keras
`SeedGenerator`; float16 adds a loss scale per optimizer. The keys come from
trainer/state/keys.py and do not depend on Keras's per-process numbering.

The traced steps are the ground truth (`check_step`, called as steps.discover traces
each step): a variable a step reads or writes that no checkpoint would hold, a
variable created while the step is traced (it would be created after the state was
keyed), or randomness whose state no checkpoint can hold (`tf.random.normal`) would
make a resumed run differ from an uninterrupted one. Each is refused in one line.
"""
import re

import keras
import numpy as np
import tensorflow as tf

from trainer.state import keys
from trainer.task import loss_scale as loss_scales
from trainer.task import optimizers as optimizer_rules
from trainer.analysis import replica_dependence
from trainer.analysis import stateful_ops
from trainer.errors import UserError

_GENERATORS = (tf.random.Generator, keras.random.SeedGenerator)  # state: one variable
_STATEFUL = (keras.layers.Layer, keras.optimizers.Optimizer, keras.metrics.Metric, *_GENERATORS)


def held(named: dict) -> dict:
  """{name: model | layer | optimizer | variable | metric | generator} found in `named`
  (a task's attributes) and in the dicts, lists and tuples they hold, at any depth; an
  item is named `<attribute>_<key or index>[_...]`.

  What a task held before layers, generators and deeper containers were walked (models,
  optimizers and variables at most one container deep) comes first, in attribute order,
  so that the checkpoint keys of those stay as they were. An object held twice is
  named where first found (a variable at each place: TaskState saves it once, where a
  model, layer or optimizer saves it, else where first held).
  """
  found = []  # (name, value, depth)

  def visit(name, value, depth: int, containers: tuple) -> None:
    if isinstance(value, (dict, list, tuple)):
      if id(value) in containers:  # a container holding itself
        return
      items = value.items() if isinstance(value, dict) else enumerate(value)
      for key, item in items:
        visit(f"{name}_{key}", item, depth + 1, (*containers, id(value)))
    elif isinstance(value, _STATEFUL) or keys.is_variable(value):
      found.append((name, value, depth))

  for name, value in named.items():
    visit(name, value, 0, ())

  def held_before(value, depth: int) -> bool:
    return depth <= 1 and (isinstance(value, (keras.Model, keras.optimizers.Optimizer))
                           or keys.is_variable(value))

  ordered = ([item for item in found if held_before(item[1], item[2])]
             + [item for item in found if not held_before(item[1], item[2])])
  result, placed = {}, set()
  for name, value, _ in ordered:
    if not keys.is_variable(value):
      if id(value) in placed:
        continue
      placed.add(id(value))
    if name in result and result[name] is not value:
      raise UserError(f"two things the task holds would both be checkpointed as {name!r} "
                      f"(an attribute and a container's item?): rename one")
    result[name] = value
  return result


class TaskState:
  """Create inside `strategy.scope()`, after task.build()."""

  def __init__(self, task, *, float16: bool, learning_rate_factor=None):
    self._task_name = type(task).__name__
    # The run's learning rate factor (trainer/loop/learning_rate.py) or None: the step
    # reads it, the checkpoints' meta holds its value (not a checkpointed variable).
    self.learning_rate_factor = learning_rate_factor
    found = task.state()
    if not isinstance(found, dict):
      raise UserError(f"{self._task_name}.state() returned {type(found).__name__}, not a "
                      f"dict of models, optimizers and variables")
    found = held(found)  # a state() of the task's own may return containers and layers too
    models = [v for v in found.values() if isinstance(v, keras.Model)]
    optimizers = [v for v in found.values() if isinstance(v, keras.optimizers.Optimizer)]
    layers = {name: v for name, v in found.items()
              if isinstance(v, (keras.layers.Layer, keras.metrics.Metric))
              and not isinstance(v, keras.Model)}
    extra = {name: v for name, v in found.items() if keys.is_variable(v)}
    extra.update({name: v.state for name, v in found.items() if isinstance(v, _GENERATORS)})
    if not models and not extra and not any(v.variables for v in layers.values()):
      raise UserError(f"{self._task_name} holds no model or variable after build(): "
                      f"keep them as attributes (self.model = ...) or return them from state()")
    for optimizer in optimizers:
      if not optimizer.built:
        raise UserError(f"{self._task_name}'s optimizer {optimizer.name!r} is not built: "
                        f"call optimizer.build(variables) in build()")
    self.models = keys.model_names(models)
    # What makes the trajectory depend on the replica count (an elastic resume refuses it).
    self._unsynchronized_batchnorm = replica_dependence.unsynchronized_batchnorm(self.models,
                                                                                layers)
    self._per_replica_draws = []  # the train step's, once traced (check_step)
    self.optimizers = keys.optimizer_names(optimizers)  # checkpoint keys: kept as they were
    # What logs call each optimizer: where the task holds it (`generator_optimizer`), the
    # same in every process (Keras numbers automatic names per process: adam, adam_1).
    attributes = {id(value): name for name, value in found.items()
                  if isinstance(value, keras.optimizers.Optimizer)}
    self.optimizer_labels = {name: attributes[id(optimizer)]
                             for name, optimizer in self.optimizers.items()}
    for name, optimizer in self.optimizers.items():  # a Task's own ones too
      optimizer_rules.check_supported(optimizer, f"{self._task_name}'s optimizer {name!r}")
    # float16: one dynamic loss scale per optimizer (its updates skip on overflow alone).
    self.loss_scales = {id(optimizer): loss_scales.DynamicLossScale() if float16 else None
                        for optimizer in optimizers}
    model_keys = keys.model_variables(self.models)
    model_keys = keys.merged(model_keys, keys.layer_variables(layers, keyed=model_keys))
    self.model_variables = keys.merged(model_keys, keys.extra_variables(
        _not_saved_yet(extra, [*model_keys.values(),
                               *(v for o in optimizers for v in o.variables)])))
    self.optimizer_variables = keys.optimizer_variables(self.optimizers, model_keys)
    for name, optimizer in self.optimizers.items():
      scale = self.loss_scales[id(optimizer)]
      if scale is not None:
        self.optimizer_variables.update({f"loss_scale/{name}/{key.split('/')[-1]}": variable
                                         for key, variable in scale.variables().items()})

  def all_variables(self) -> list:
    return [*self.model_variables.values(), *self.optimizer_variables.values()]

  def check_step(self, what: str, trace) -> None:
    """`trace()` traces the task's step `what` ("train_step", "eval_step") and returns its
    concrete function (steps.discover). Refuses, in one line: a variable created while it
    is traced, randomness with a hidden state, a variable it uses that is not checkpointed."""
    step = f"{self._task_name}'s {what}"

    def refuse_creation(next_creator, **kwargs):
      del next_creator
      name = str(kwargs.get("name") or "a variable")
      raise UserError(_global_seed_generator(step, name) or (
          f"{step} creates variable {name!r} while it is traced: it would not be "
          f"checkpointed; create it in build()"))

    with tf.variable_creator_scope(refuse_creation):
      graph = trace().graph
    graph_def = graph.as_graph_def()
    if what == "train_step":
      self._per_replica_draws = replica_dependence.shape_dependent_draws(graph_def)
    stateful = stateful_ops.first(graph_def, variable_random=False, writes=False)
    if stateful is not None:
      node, op = stateful
      instead = ("step.normal / step.uniform, or tf.random.stateless_* with seed=step.seed()"
                 if what == "train_step" else "tf.random.stateless_* with a fixed seed")
      raise UserError(f"{step} draws randomness with a hidden state ({op} in {node}), so a "
                      f"resumed run would draw other numbers: use {instead}")
    saved = set()
    for variable in [*self.all_variables(),
                     *(v for o in self.optimizers.values() for v in o.variables)]:
      saved.update(_identities(variable))  # the learning rate: from the config, on purpose
    if self.learning_rate_factor is not None:  # its value: in the meta (action_state)
      saved.update(_identities(self.learning_rate_factor))
    for variable in graph.variables:
      if not saved.intersection(_identities(variable)):
        name = re.sub(r"/replica_\d+(?=:|$)", "", variable.name)
        if name.startswith("StateVar"):
          name += " (a tf.random.Generator's state)"
        raise UserError(_global_seed_generator(step, name) or (
            f"{step} uses variable {name!r} that no checkpoint would hold: keep it as an "
            f"attribute of the task (or in a dict or list it holds), or return it from "
            f"state()"))

  def replica_dependence(self, deterministic: bool) -> list[str]:
    """In words, what makes this task's trajectory depend on the replica count
    (trainer/analysis/replica_dependence.py): unsynchronized BatchNorm layers; randomness
    drawn per replica, under `deterministic` (otherwise no draw is per example, and no
    number is promised)."""
    return [*self._unsynchronized_batchnorm,
            *(replica_dependence.draws(self._per_replica_draws) if deterministic else [])]

  def strategy_dependence(self, deterministic: bool) -> list[str]:
    """What depends on the strategy at the same replica count: randomness drawn per
    replica (a tf.random.Generator's stream differs under a distribution strategy)."""
    return replica_dependence.draws(self._per_replica_draws) if deterministic else []

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
      label = self.optimizer_labels[name] if len(self.optimizers) > 1 else name
      lines.append(f"optimizer {label}: {optimizer_rules.describe(optimizer, updated)}")
    return lines

  def averaged_weights(self):
    """A context: the moving averages (use_ema) in place of the weights they average."""
    return optimizer_rules.averaged_weights(list(self.optimizers.values()))

  def learning_rate_vector(self):
    """In a tf.function: every optimizer's learning rate for its next step (float64 [n],
    the order of `learning_rates`): the train loop returns it with its sums."""
    return tf.stack([tf.cast(optimizer.learning_rate, tf.float64)
                     for optimizer in self.optimizers.values()])

  def learning_rates(self, vector) -> dict:
    """{"learning_rate": rate} (one optimizer) or one per optimizer,
    `learning_rate_<where the task holds it>`, from `learning_rate_vector()`'s value."""
    rates = vector.numpy().tolist()
    if len(self.optimizers) == 1:
      return {"learning_rate": rates[0]}
    return {f"learning_rate_{self.optimizer_labels[name]}": rate
            for name, rate in zip(self.optimizers, rates)}


def _not_saved_yet(extra: dict, saved: list) -> dict:
  """The task's own variables ({name: variable}) that no model, layer or optimizer saves
  already, each once (where first held): a list of a model's variables held as an
  attribute (`self.trainables = model.trainable_variables`) is saved as the model's."""
  seen = set()
  for variable in saved:
    seen.update(_identities(variable))
  kept = {}
  for name, variable in extra.items():
    identities = _identities(variable)
    if not seen.intersection(identities):
      kept[name] = variable
    seen.update(identities)
  return kept


def _identities(variable) -> set:
  """The ids of a variable and of everything a traced step may read in its place: a Keras
  variable's tf.Variable, a distributed variable's per-device components, a sharded
  variable's shards, and their resource handles."""
  found, stack = set(), [variable]
  while stack:
    value = stack.pop()
    if id(value) in found:
      continue
    found.add(id(value))
    if isinstance(value, keras.Variable):
      stack.append(value.value)
    if isinstance(value, tf.distribute.DistributedValues):
      stack.extend(value.values)
    stack.extend(getattr(value, "variables", None) or [])  # a ShardedVariable's shards
    if hasattr(value, "_v"):  # a parameter server's AggregatingVariable
      stack.append(value._v)  # pylint: disable=protected-access
    if isinstance(value, tf.Variable) and not isinstance(value, tf.distribute.DistributedValues):
      found.add(id(value.handle))
  return found


def _global_seed_generator(step: str, name: str) -> str | None:
  """The line for Keras's global SeedGenerator (keras.random.* called without seed=)."""
  if not re.search(r"seed_generator_state(:\d+)?$", name):
    return None
  return (f"{step} draws randomness from a Keras SeedGenerator ({name!r}) that no "
          f"checkpoint would hold (keras.random.* without seed=, or a random layer the task "
          f"does not hold?), so a resumed run would "
          f"draw other numbers: use step.normal / step.uniform / step.seed, or pass a "
          f"keras.random.SeedGenerator the task holds as seed=")


def load_model_weights(model, path: str) -> None:
  """BuildContext.load_weights: `model`'s weights from the newest checkpoint of a distloop
  model_dir (or its checkpoints/ or one checkpoints/<step>/). UserError if they do not
  match."""
  from trainer.state import checkpoints  # pylint: disable=g-import-not-at-top  (orbax)
  from trainer.state import model_weights  # pylint: disable=g-import-not-at-top
  variables = keys.model_variables(keys.model_names([model]))
  # Its errors name this call, not checkpoint.init_from (a field the user never set).
  loaded, _, _ = model_weights.read_model_weights(
      path, checkpoints.variables_tree(variables),
      who=f"load_weights({model.name!r}, {path!r})", ours=f"model {model.name!r}",
      advice=f"pass load_weights a model built as the one that wrote {path} (the same "
             f"layers, names and shapes)")
  checkpoints.assign_tree(variables, loaded)
