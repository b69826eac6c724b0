"""What makes a Task's trajectory depend on the replica count, in words: an elastic
resume of it is refused (trainer/state/elastic.py).

- An unsynchronized `BatchNormalization` normalizes by the statistics of each replica's
  share: 32 examples on 2 replicas, 64 on 1. `synchronized=True` (Keras, TensorFlow
  backend) computes them over the global batch: the same on any replica count.
- Randomness not drawn per example (`shape_dependent_draws` finds the ops in the traced step): a
  `tf.random.Generator`, `StepContext.seed()`, `keras.random.shuffle` (MixUp, CutMix), a
  random layer in `train.accumulation_steps`' micro-batches (each draws with the seed's
  next value).
"""
import keras

from trainer.analysis import stateful_ops
from trainer.task import randomness

_STATELESS_DRAWS = ("StatelessRandom", "StatelessTruncatedNormal", "StatelessMultinomial",
                    "StatelessParameterizedTruncatedNormal")
_NOT_DRAWS = ("StatelessRandomGetKeyCounter", "StatelessRandomGetAlg",
              "StatelessRandomGetKeyCounterAlg")


def unsynchronized_batchnorm(models: dict, layers: dict) -> list[str]:
  """'BatchNormalization <path> (unsynchronized)' for each such layer the task holds."""
  found, seen = [], set()
  roots = [*models.values(), *layers.values()]
  for root in roots:
    candidates = [root]
    if hasattr(root, "_flatten_layers"):
      candidates += list(root._flatten_layers(include_self=False, recursive=True))  # pylint: disable=protected-access
    for layer in candidates:
      if (isinstance(layer, keras.layers.BatchNormalization) and id(layer) not in seen
          and not getattr(layer, "synchronized", False)):
        seen.add(id(layer))
        found.append(f"BatchNormalization {layer.path or layer.name!r} (unsynchronized: "
                     f"statistics of each replica's share; synchronized=True would not be)")
  return found


def draws(ops: list[str]) -> list[str]:
  """The random ops of a train step that were not drawn per example, as one reason."""
  if not ops:
    return []
  more = f" and {len(ops) - 1} more" if len(ops) > 1 else ""
  return [f"randomness drawn per replica ({ops[0]}{more}: a tf.random.Generator, step.seed(), "
          f"keras.random.shuffle, or a random layer in train.accumulation_steps' micro-batches)"]


def shape_dependent_draws(graph_def) -> list[str]:
  """'op in node' for each random op in the traced step (and every function it calls)
  whose numbers change with the replica count: a stateful one (a tf.random.Generator),
  StepContext.seed()'s, and a Keras draw not made per example (PER_REPLICA). A stateless op
  of your own is as per-example as its seed (one of step.example_seeds: per example; of
  step.seed(): named by that seed's op), so it is not named by itself."""
  nodes = [*graph_def.node, *(node for function in graph_def.library.function
                              for node in function.node_def)]
  return [f"{node.op} in {node.name}" for node in nodes
          if node.op in stateful_ops.HIDDEN_RANDOM_OPS or node.op in stateful_ops.VARIABLE_RANDOM_OPS
          or (randomness.PER_REPLICA_SCOPE in node.name and node.op.startswith(_STATELESS_DRAWS)
              and node.op not in _NOT_DRAWS)]
