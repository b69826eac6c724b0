"""Variable-length examples padded per batch (`data.pad_to`, `data.pad_value`).

Opt-in: images of different sizes padded silently would train on a silent wrong
result, so a source with variable-length examples is refused unless `data.pad_to`
is set. Each per-replica batch is padded to its own longest example ("longest"),
or up to the smallest bucket boundary that holds it ("32,64,128": a few shapes,
so fewer retraces; longer batches to their longest). With `data.bucket_window`
(input_pipelines/buckets.py) the examples of a batch are of similar length and
every replica of a global batch is padded to the global batch's length. The
padding depends only on the rows of the batch, so the order and an exact resume
hold as for fixed shapes.

Numpy here (the readers of in-memory and random-access sources) and TensorFlow
for streams (`padded_batch`, then `to_buckets`).
"""
import dataclasses

import numpy as np

from input_pipelines.errors import DataError


@dataclasses.dataclass(frozen=True)
class Padding:
  """`boundaries` empty: each batch padded to its longest; `value`: what padding holds;
  `window`: global batches whose examples are grouped by length (0: none)."""
  boundaries: tuple = ()
  value: float = 0.0
  window: int = 0

  def length(self, longest: int) -> int:
    """The padded length of a batch whose longest example has `longest` steps."""
    for boundary in self.boundaries:
      if boundary >= longest:
        return boundary
    return longest


def parse(pad_to: str) -> tuple | None:
  """`data.pad_to` -> None ("": refuse), () ("longest") or the boundaries; ValueError
  saying what it must be otherwise."""
  text = str(pad_to).strip()
  if not text:
    return None
  if text == "longest":
    return ()
  parts = [part.strip() for part in text.split(",")]
  if not all(part.isdigit() for part in parts):
    raise ValueError("must be \"\", \"longest\" or bucket boundaries such as \"32,64,128\"")
  boundaries = tuple(int(part) for part in parts)
  if boundaries[0] <= 0 or any(b >= c for b, c in zip(boundaries, boundaries[1:])):
    raise ValueError("bucket boundaries must be positive and strictly increasing "
                     "(e.g. \"32,64,128\")")
  return boundaries


def from_config(data_config) -> Padding | None:
  """The Padding `data.pad_to` and `data.pad_value` ask for; None when pad_to is ""."""
  boundaries = parse(data_config.pad_to)
  if boundaries is None:
    return None
  return Padding(boundaries, float(data_config.pad_value), int(data_config.bucket_window))


def is_variable(shape) -> bool:
  return any(d is None for d in shape)


def pad_examples(examples: np.ndarray, rest: tuple, dtype, padding: Padding,
                 longest: int = 0) -> np.ndarray:
  """An object array of b examples [L_i, *rest] -> one [b, L, *rest] array of `dtype`,
  L = padding.length(max(L_i, longest)), the tail filled with padding.value (`longest`:
  the global batch's, so that every replica of it has one shape)."""
  longest = max(max((len(e) for e in examples), default=0), int(longest))
  out = np.full((len(examples), padding.length(longest), *rest), padding.value, dtype=dtype)
  for i, example in enumerate(examples):
    out[i, :len(example)] = example
  return out


def pad_leaves(leaves: list, specs: list, padding: Padding | None, longest=None) -> list:
  """The leaves read for a batch, the variable ones (spec shape with None) padded;
  `longest`: at least this length per variable leaf (see `lengths`)."""
  if padding is None:
    return leaves
  variable = [i for i, (shape, _) in enumerate(specs) if is_variable(shape)]
  at_least = dict(zip(variable, longest if longest is not None else [0] * len(variable)))
  return [pad_examples(leaf, tuple(shape[1:]), dtype, padding, at_least[i])
          if i in at_least else leaf for i, (leaf, (shape, dtype)) in enumerate(zip(leaves, specs))]


def lengths(leaves: list, specs: list) -> np.ndarray:
  """int64 [b, V]: each example's length in each of the V variable leaves."""
  columns = [[len(example) for example in leaf]
             for leaf, (shape, _) in zip(leaves, specs) if is_variable(shape)]
  return np.array(columns, np.int64).T.reshape(len(leaves[0]), len(columns))


def check_examples(where: str, name: str, examples: np.ndarray):
  """(shape (None, *rest), dtype) of an object array of per-example numeric arrays
  [L_i, *rest]; DataError (a line naming the first odd element) if they differ."""
  if examples.ndim != 1 or not len(examples):
    raise DataError(f"{where}: {name} is an object array of shape {list(examples.shape)}; "
                     f"variable-length examples are a 1-D object array of per-example arrays")
  first = None
  for i, example in enumerate(examples):
    if not isinstance(example, np.ndarray):
      raise DataError(f"{where}: {name} element {i} is a {type(example).__name__}, not a "
                       f"numpy array")
    if example.dtype.kind not in "biuf" or example.ndim == 0:
      raise DataError(f"{where}: {name} element {i} is {example.dtype}{list(example.shape)}; "
                       f"each example must be a numeric array of rank >= 1 [length, ...]")
    if first is None:
      first = example
    elif example.dtype != first.dtype or example.shape[1:] != first.shape[1:]:
      raise DataError(f"{where}: {name} element {i} is {example.dtype}"
                       f"{_shape(example.shape)}, element 0 {first.dtype}{_shape(first.shape)}; "
                       f"every example must have the same dtype and trailing dims")
  return (None, *first.shape[1:]), first.dtype


def as_examples(value) -> np.ndarray | None:
  """A list of arrays, or an object array of them, as a 1-D object array; None if `value`
  is neither (a plain array)."""
  if isinstance(value, np.ndarray) and value.dtype != object:
    return None
  if isinstance(value, np.ndarray) or (isinstance(value, (list, tuple)) and value
                                       and all(isinstance(v, np.ndarray) for v in value)):
    examples = np.empty(len(value), dtype=object)
    for i, example in enumerate(value):
      examples[i] = example
    return examples
  return None


def _shape(shape) -> str:
  return "[" + ", ".join("?" if i == 0 else str(d) for i, d in enumerate(shape)) + "]"


def to_buckets(batch, padding: Padding, element_spec):
  """A padded_batch()'d structure padded further on each variable axis up to the smallest
  boundary that holds it (TensorFlow; streams). `element_spec`: the examples' spec."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top  (numpy callers never need it)
  if not padding.boundaries:
    return batch
  boundaries = tf.constant(padding.boundaries, tf.int32)

  def bucket(length):
    bigger = tf.boolean_mask(boundaries, boundaries >= length)
    return tf.cond(tf.size(bigger) > 0, lambda: bigger[0], lambda: length)

  def pad(t, spec):
    shape = spec.shape.as_list()
    if not is_variable(shape):
      return t
    paddings = [[0, 0]]
    for axis, d in enumerate(shape, start=1):
      length = tf.shape(t)[axis]
      paddings.append([0, bucket(length) - length if d is None else 0])
    return tf.pad(t, paddings, constant_values=pad_constant(t.dtype, padding.value))
  return tf.nest.map_structure(pad, batch, element_spec)


def pad_constant(dtype, value: float):
  """`value` as a scalar of `dtype` (b"" for strings)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  if dtype == tf.string:
    return tf.constant(b"", tf.string)
  if dtype == tf.bool:
    return tf.constant(bool(value), tf.bool)
  return tf.cast(tf.constant(value, tf.float64), dtype)
