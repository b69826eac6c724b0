"""Sharded variables: a large variable split along axis 0 over the parameter servers.

`runtime.variable_partitioner` makes ParameterServerStrategy create some variables
as a tf ShardedVariable (a Keras variable then holds one as its value). Three places
of the trainer need to see through it, and come here:

- gradients: TensorFlow's tape cannot differentiate with respect to a ShardedVariable
  (it has no handle), so the tape is asked for its shards' gradients, which are
  joined into one gradient of the full shape (sparse IndexedSlices stay sparse);
- optimizer slots: Keras creates a slot "colocated with" its variable, and
  ParameterServerStrategy never partitions a colocated variable: Adam's m and v of a
  sharded table would land whole on the coordinator. `slots_follow_shards()`
  drops that colocation for sharded references, so the slots are partitioned
  like their variable (same shape, same partitioner, same shards);
- checkpoints: the full value (shards joined) is saved, and a full value is assigned
  back (split over whatever shards exist now), so a checkpoint does not depend on
  the number of parameter servers.
"""
import contextlib

import numpy as np
import tensorflow as tf
from tensorflow.python.distribute import sharded_variable  # pylint: disable=g-direct-tensorflow-import

_KINDS = ("fixed", "min_size", "max_size")


def parse_partitioner(spec: str) -> tuple[str, int] | None:
  """runtime.variable_partitioner "KIND:N" -> (kind, n); "" -> None; ValueError if bad.
  Pure Python: validation calls it before TensorFlow is imported."""
  if not spec:
    return None
  kind, _, number = spec.partition(":")
  if kind not in _KINDS or not number.strip().isdigit() or int(number) < 1:
    raise ValueError("must be \"\" (none), fixed:<shards>, min_size:<bytes> or "
                     "max_size:<bytes> with a positive integer")
  return kind, int(number)


def partitioner(spec: str, num_ps: int):
  """The tf.distribute partitioner of runtime.variable_partitioner, at most `num_ps`
  shards (more than one shard per server buys nothing), or None."""
  parsed = parse_partitioner(spec)
  if parsed is None:
    return None
  kind, number = parsed
  partitioners = tf.distribute.experimental.partitioners
  if kind == "fixed":
    return partitioners.FixedShardsPartitioner(num_shards=min(number, num_ps))
  if kind == "min_size":
    return partitioners.MinSizePartitioner(min_shard_bytes=number, max_shards=num_ps)
  return partitioners.MaxSizePartitioner(max_shard_bytes=number, max_shards=num_ps)


def shards(variable) -> list | None:
  """The shard tf.Variables of a (Keras) variable held as a ShardedVariable, else None."""
  value = getattr(variable, "value", variable)
  if isinstance(value, sharded_variable.ShardedVariable):
    return list(value.variables)
  return None


def is_sharded(variable) -> bool:
  return shards(variable) is not None


def to_numpy(variable) -> np.ndarray:
  """The variable's full value as a new numpy array (a sharded one's shards joined)."""
  parts = shards(variable)
  if parts is None:
    return np.array(variable)
  return np.concatenate([part.numpy() for part in parts], axis=0)


def gradient_sources(variables: list) -> list:
  """What to ask the tape for: each sharded variable's shards in its place."""
  sources = []
  for variable in variables:
    sources.extend(shards(variable) or [variable])
  return sources


def join_gradients(variables: list, gradients: list) -> list:
  """One gradient per variable from `gradient_sources`' gradients: a sharded variable's
  shard gradients joined along axis 0 (IndexedSlices stay sparse, indices offset)."""
  joined, position = [], 0
  for variable in variables:
    parts = shards(variable)
    if parts is None:
      joined.append(gradients[position])
      position += 1
      continue
    pieces = gradients[position:position + len(parts)]
    position += len(parts)
    joined.append(_join(parts, pieces, variable))
  return joined


def _join(parts: list, pieces: list, variable):
  if all(piece is None for piece in pieces):
    return None
  if all(piece is None or isinstance(piece, tf.IndexedSlices) for piece in pieces):
    values, indices, offset = [], [], 0
    for part, piece in zip(parts, pieces):
      if piece is not None:
        values.append(piece.values)
        indices.append(tf.cast(piece.indices, tf.int64) + offset)
      offset += part.shape[0]
    return tf.IndexedSlices(tf.concat(values, 0), tf.concat(indices, 0),
                            tf.constant(list(variable.shape), tf.int64))
  return tf.concat([tf.zeros(part.shape, part.dtype) if piece is None
                    else tf.convert_to_tensor(piece) for part, piece in zip(parts, pieces)], 0)


@contextlib.contextmanager
def slots_follow_shards():
  """Inside strategy.scope(): variables created "colocated with" a sharded variable
  (Keras's optimizer slots) are partitioned like it instead (see the module doc)."""
  def creator(next_creator, **kwargs):
    if isinstance(kwargs.get("colocate_with"), sharded_variable.ShardedVariable):
      kwargs.pop("colocate_with")
    return next_creator(**kwargs)
  with tf.variable_creator_scope(creator):
    yield


def placement(keyed_variables: dict) -> list[str]:
  """One line per sharded variable: its key, full shape and each shard's rows and device
  (the start-up log says where a table went)."""
  lines = []
  for key, variable in keyed_variables.items():
    parts = shards(variable)
    if parts is not None:
      where = ", ".join(f"{part.shape[0]} rows on {part.device}" for part in parts)
      lines.append(f"sharded variable {key} {tuple(variable.shape)}: {len(parts)} shards: "
                   f"{where}")
  return lines
