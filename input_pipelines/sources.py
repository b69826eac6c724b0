"""The three forms a data builder may return for a split, checked and wrapped.

1. `(features, labels)` numpy arrays: features an array or a dict of arrays,
   labels an array or (a multi-output model: trainer/setup/heads.py) a dict of
   arrays keyed by output name, axis 0 = examples  -> `ArraySource` (held in
   memory, gathered per batch);
2. a random-access source: any object with `__len__()` and
   `__getitem__(indices: int64 array) -> (features, labels)` numpy batches
   -> `IndexedSource` (decoded on demand: the data need not fit in memory);
3. a zero-argument callable returning an unbatched `tf.data.Dataset` of
   `(features, labels)` -> `StreamSource` (opaque: it cannot be indexed, so a
   resumed run fast-forwards it; see input_pipelines/batching.py).

Converted data on disk (`data.name='records'`) is a fourth, built-in form,
`input_pipelines.records.records.RecordSource`. Every form but the stream is an
`IndexableSource`: batching reads any set of rows through the same three
methods, so the order (input_pipelines/order.py) is the same for all of them.

Variable-length features (`data.pad_to` set, input_pipelines/padding.py): in
the numpy forms a feature may be a 1-D object array of per-example arrays
[L_i, *rest] (same dtype and trailing dims; a list of arrays is converted); a
stream's examples may have unknown (None) dims. Its per-example spec is then
(None, *rest), and batching pads each per-replica batch. Without pad_to they
are refused, naming it: padding images of different sizes silently would be
a silent wrong result.

Who owns what: the user's code says what example k is; distloop owns which
examples form each batch (the order), batching, the split across replicas and
workers, parallel reads and prefetch. Checks here are numpy only (no
TensorFlow): a bad source is one line naming the plug-in, before anything runs.
"""
from typing import Callable

import numpy as np

from input_pipelines import padding as padding_lib
from input_pipelines.errors import DataError

_PROBE = 2  # examples read from an indexed source to learn its structure


def _leaves(features) -> dict:
  """{'': array} for a bare array, else the dict itself."""
  return features if isinstance(features, dict) else {"": features}


def _describe(key: str) -> str:
  return f"features[{key!r}]" if key else "features"


def _label_keys(labels) -> list[str] | None:
  """A dict of labels' keys, in the order leaves are read; None for one array."""
  return sorted(labels) if isinstance(labels, dict) else None


def _label_leaves(labels) -> dict:
  """{'labels': array} or {"labels['class']": array, ...}: names for messages."""
  if isinstance(labels, dict):
    return {f"labels[{key!r}]": labels[key] for key in sorted(labels)}
  return {"labels": labels}


class Source:
  """A split of examples. `feature_name`: the serving input name of bare-array features;
  `padding`: how batches of variable-length examples are padded (None: refused)."""
  feature_name = "inputs"
  padding: padding_lib.Padding | None = None

  def __init__(self, where: str):
    self.where = where  # e.g. "data.name='tabular' train split", for messages

  def class_count(self) -> tuple[int, str] | None:
    """How many classes the labels name, and what says so (for model.num_classes=0);
    None if this source cannot tell (float labels, an opaque stream)."""
    return None

  def label_keys(self):
    """A dict of labels' keys (sorted), None for one label array, ... if unknown."""
    return ...


class IndexableSource(Source):
  """Random access by row, as batching reads it: `read_leaves(rows)` in numpy (run in
  tf.numpy_function, from several tf.data threads at once: it must be thread-safe),
  then `assemble(leaves)` in TensorFlow turns those arrays into `(features, labels)`
  (the place for decoding: a tensor op, parallel per batch, never a graph constant)."""

  def __len__(self) -> int:
    raise NotImplementedError

  def leaf_specs(self) -> list[tuple[tuple, np.dtype]]:
    """(per-example shape, dtype) of each array `read_leaves` returns."""
    raise NotImplementedError

  def read_leaves(self, rows: np.ndarray) -> list[np.ndarray]:
    raise NotImplementedError

  def assemble(self, leaves: list):
    raise NotImplementedError

  def example_bytes(self) -> int:
    """About how many bytes one example's leaves hold (variable-size leaves count 0):
    batching sizes its reads by it, so memory in flight does not scale with records."""
    return sum(int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
               for shape, dtype in self.leaf_specs()
               if np.dtype(dtype).kind not in "SOU" and not padding_lib.is_variable(shape))

  def decoded_example_bytes(self) -> int:
    """About how many bytes one example holds once decoded, as a batch holds it (at least:
    variable-size leaves count 0); input_pipelines/memory.py bounds batches by it."""
    return self.example_bytes()


class ArraySource(IndexableSource):
  """Examples held in memory. `decode` (built-ins only) maps a batch of stored
  features to what the model sees, in TensorFlow (e.g. uint8 -> float in [0, 1])."""

  def __init__(self, features, labels, *, where: str, decode: Callable | None = None,
               feature_name: str = "inputs", num_classes: int | None = None,
               padding: padding_lib.Padding | None = None):
    super().__init__(where)
    self.padding = padding
    self.num_classes = num_classes  # a built-in's known class count (the MNIST family: 10)
    _check_labels(where, labels)
    self.labels = ({key: np.asarray(value) for key, value in labels.items()}
                   if isinstance(labels, dict) else np.asarray(labels))
    self.decode = decode
    self.feature_name = feature_name
    if isinstance(features, dict):  # lists of per-example arrays: object arrays
      features = {k: _examples_or_value(v) for k, v in features.items()}
    else:
      features = _examples_or_value(features)
    self.features = features
    self._variable = {}  # key -> (None, *rest), dtype of a variable-length feature
    leaves = _leaves(features)
    if not leaves:
      raise DataError(f"{where}: features is an empty dict")
    label_leaves = _label_leaves(self.labels)
    first_label = next(iter(label_leaves))
    count = len(label_leaves[first_label]) if label_leaves[first_label].ndim else 0
    for name, value in label_leaves.items():
      _check_dtype(where, name, value.dtype)
      if value.ndim == 0 or len(value) != count:
        raise DataError(f"{where}: {name} has {len(value) if value.ndim else 0} examples but "
                        f"{first_label} has {count}")
    for key, value in leaves.items():
      if isinstance(value, np.ndarray) and value.dtype == object:
        self._variable[key] = _variable_spec(where, _describe(key), value, padding)
      elif not isinstance(value, np.ndarray):
        raise DataError(f"{where}: {_describe(key)} is a {type(value).__name__}, "
                        f"not a numpy array")
      else:
        _check_dtype(where, _describe(key), value.dtype)
      if value.ndim == 0 or len(value) != count:
        raise DataError(f"{where}: {_describe(key)} has {len(value) if value.ndim else 0} "
                        f"examples but labels has {count}")
    if count == 0:
      raise DataError(f"{where}: the split is empty")
    self._length = count

  def __len__(self) -> int:
    return self._length

  def class_count(self):
    if self.num_classes:
      return self.num_classes, f"{self.where.rsplit(' ', 2)[0]}: {self.num_classes} classes"
    if isinstance(self.labels, dict):
      return None  # several outputs: the model names its own class counts
    return _largest_class_id(self.labels, self.where)

  def decoded_example_bytes(self) -> int:
    """`decode` turns stored features into float32 (uint8 images: 4x the bytes)."""
    if self.decode is None:
      return self.example_bytes()
    specs = self.leaf_specs()
    features, labels = specs[:len(specs) - self._label_count()], specs[-self._label_count():]
    return (sum(int(np.prod(shape, dtype=np.int64)) * 4 for shape, _ in features
                if not padding_lib.is_variable(shape))
            + sum(int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
                  for shape, dtype in labels))

  def __getitem__(self, indices):
    take = lambda a: a[indices]  # pylint: disable=unnecessary-lambda-assignment
    features = ({k: take(v) for k, v in self.features.items()}
                if isinstance(self.features, dict) else take(self.features))
    labels = ({k: take(v) for k, v in self.labels.items()}
              if isinstance(self.labels, dict) else take(self.labels))
    return features, labels

  # Read through numpy, never embedded in the graph: no 2 GB GraphDef limit, no copy.
  def _keys(self):
    return sorted(self.features) if isinstance(self.features, dict) else None

  def label_keys(self):
    return _label_keys(self.labels)

  def _label_count(self) -> int:
    return len(self.labels) if isinstance(self.labels, dict) else 1

  def _arrays(self) -> list[np.ndarray]:
    """Every leaf, features then labels, in the order read_leaves returns them."""
    keys = self._keys()
    arrays = [self.features[k] for k in keys] if keys else [self.features]
    return [*arrays, *_label_leaves(self.labels).values()]

  def leaf_specs(self):
    keys = [*(self._keys() or [""]), *[None] * self._label_count()]  # labels: fixed shape
    return [self._variable.get(key) or (a.shape[1:], a.dtype)
            for key, a in zip(keys, self._arrays())]

  def read_leaves(self, rows):
    return [np.take(a, rows, axis=0) for a in self._arrays()]

  def assemble(self, leaves, decode: bool = True):
    """`decode=False`: leave `self.decode` to the train step, on the device."""
    split = len(leaves) - self._label_count()
    features, labels = leaves[:split], leaves[split:]
    keys = self._keys()
    batch = dict(zip(keys, features)) if keys else features[0]
    if decode and self.decode is not None:
      batch = self.decode(batch)
    label_keys = _label_keys(self.labels)
    return batch, dict(zip(label_keys, labels)) if label_keys else labels[0]


class IndexedSource(IndexableSource):
  """A user's random-access source, read a batch of indices at a time.

  `example_spec` is learnt from the first examples; `read(indices)` checks every
  batch against it, so a source that changes shape or dtype midway fails with
  a line naming it instead of a shape error deep inside TensorFlow.
  """

  def __init__(self, source, *, where: str, padding: padding_lib.Padding | None = None):
    super().__init__(where)
    self.padding = padding
    self.source = source
    self.feature_name = getattr(source, "feature_name", Source.feature_name)
    try:
      self._length = int(len(source))
    except (Exception, SystemExit) as e:  # pylint: disable=broad-except
      raise DataError(f"{where}: len() raised {type(e).__name__}: {e}") from None
    if self._length <= 0:
      raise DataError(f"{where}: the split is empty (len() is {self._length})")
    probe = np.arange(min(_PROBE, self._length), dtype=np.int64)
    features, labels = self._call(probe)
    self.structure = sorted(features) if isinstance(features, dict) else None
    self.label_structure = _label_keys(labels)
    self.example_spec = {
        k: (_variable_spec(where, _describe(k), v, padding) if v.dtype == object
            else (v.shape[1:], v.dtype)) for k, v in _leaves(features).items()}
    self.example_spec.update({name: (v.shape[1:], v.dtype)
                              for name, v in _label_leaves(labels).items()})
    self._check(probe, features, labels)

  def __len__(self) -> int:
    return self._length

  def class_count(self):
    if self.label_structure is not None:
      return None  # several outputs: the model names its own class counts
    classes = getattr(self.source, "classes", None)  # image_folder: the class folders
    if classes is not None and len(classes):
      return len(classes), f"{self.where}: {len(classes)} classes ({_first_names(classes)})"
    count = getattr(self.source, "num_classes", None)
    if isinstance(count, int) and count > 0:
      return count, f"{self.where}: num_classes={count}"
    labels = getattr(self.source, "labels", None)
    return _largest_class_id(labels, self.where) if isinstance(labels, np.ndarray) else None

  def __getitem__(self, indices):
    return self.read(np.asarray(indices, dtype=np.int64))

  def read(self, indices: np.ndarray):
    features, labels = self._call(indices)
    self._check(indices, features, labels)
    return features, labels

  def label_keys(self):
    return self.label_structure

  def _label_names(self) -> list[str]:
    if self.label_structure is None:
      return ["labels"]
    return [f"labels[{key!r}]" for key in self.label_structure]

  def leaf_specs(self):
    keys = self.structure if self.structure is not None else [""]
    return [self.example_spec[k] for k in [*keys, *self._label_names()]]

  def read_leaves(self, rows):
    features, labels = self.read(rows)
    leaves = [features[k] for k in self.structure] if self.structure is not None else [features]
    return [*leaves, *_label_leaves(labels).values()]

  def assemble(self, leaves):
    split = len(leaves) - len(self._label_names())
    features, labels = leaves[:split], leaves[split:]
    labels = (dict(zip(self.label_structure, labels)) if self.label_structure is not None
              else labels[0])
    if self.structure is not None:
      return dict(zip(self.structure, features)), labels
    return features[0], labels

  def _call(self, indices: np.ndarray):
    try:
      batch = self.source[indices]
    except (Exception, SystemExit) as e:  # pylint: disable=broad-except  (user code)
      raise DataError(f"{self.where}: reading {_examples(indices)} raised "
                      f"{type(e).__name__}: {str(e).strip()[:300]}") from None
    if not isinstance(batch, (tuple, list)) or len(batch) != 2:
      raise DataError(f"{self.where}: __getitem__ must return (features, labels), "
                      f"got {type(batch).__name__}")
    features, labels = batch
    if isinstance(features, dict):
      features = {k: self._as_array(indices, _describe(k), v) for k, v in features.items()}
    else:
      features = self._as_array(indices, "features", features)
    _check_labels(self.where, labels)
    if isinstance(labels, dict):
      return features, {k: np.asarray(v) for k, v in labels.items()}
    return features, np.asarray(labels)

  def _as_array(self, indices, name: str, value) -> np.ndarray:
    """A feature as numpy: per-example arrays of varying length as an object array."""
    try:
      return np.asarray(value)
    except ValueError as e:  # a ragged list: numpy cannot stack it
      examples = padding_lib.as_examples(value) if self.padding is not None else None
      if examples is not None:
        return examples
      raise DataError(f"{self.where}: {name} of {_examples(indices)} cannot be one array "
                      f"({str(e).strip()[:200]}); return per-example arrays of varying length "
                      f"as a list or an object array, with data.pad_to=longest") from None

  def _check(self, indices, features, labels) -> None:
    got_structure = sorted(features) if isinstance(features, dict) else None
    if got_structure != self.structure:
      raise DataError(f"{self.where}: {_examples(indices)} have features "
                      f"{got_structure or 'array'}, the first ones {self.structure or 'array'}")
    if _label_keys(labels) != self.label_structure:
      raise DataError(f"{self.where}: {_examples(indices)} have labels "
                      f"{_label_keys(labels) or 'array'}, the first ones "
                      f"{self.label_structure or 'array'}")
    arrays = {**_leaves(features), **_label_leaves(labels)}
    for key, value in arrays.items():
      name = key if key.startswith("labels") else _describe(key)
      shape, dtype = self.example_spec[key]
      if padding_lib.is_variable(shape):
        if value.dtype != object:
          raise DataError(f"{self.where}: {name} of {_examples(indices)} are "
                          f"{value.dtype}{list(value.shape[1:])}, the first ones per-example "
                          f"arrays of varying length; return the same form for every batch")
        got = _variable_spec(self.where, f"{name} of {_examples(indices)}", value, self.padding)
        if len(value) != len(indices) or got != (shape, dtype):
          raise DataError(f"{self.where}: {name} of {_examples(indices)} are {len(value)} "
                          f"{got[1]}{_shape(list(got[0]))} examples, the first ones "
                          f"{dtype}{_shape(list(shape))}; every example must have the same "
                          f"dtype and trailing dims")
        continue
      if value.dtype == object:
        raise DataError(f"{self.where}: {name} of {_examples(indices)} are per-example arrays "
                        f"of varying length, the first ones {dtype}{list(shape)}; return the "
                        f"same form for every batch")
      _check_dtype(self.where, name, value.dtype)
      if value.ndim == 0 or value.shape[0] != len(indices):
        raise DataError(f"{self.where}: {name} of a batch of {len(indices)} indices has shape "
                        f"{value.shape}; axis 0 must be the {len(indices)} examples")
      if value.shape[1:] != shape or value.dtype != dtype:
        raise DataError(f"{self.where}: {name} of {_examples(indices)} are "
                        f"{value.dtype}{list(value.shape[1:])}, the first ones "
                        f"{dtype}{list(shape)}; every example must have the same shape and dtype")


class StreamSource(Source):
  """A callable returning an unbatched tf.data.Dataset of (features, labels)."""

  def __init__(self, make_dataset: Callable, *, where: str,
               padding: padding_lib.Padding | None = None):
    super().__init__(where)
    self.padding = padding
    self.make_dataset = make_dataset

  def check_element_spec(self, element_spec) -> None:
    """DataError unless the elements are `(features, labels)` examples of one fixed shape,
    or with `padding` dims that vary (None): distloop batches them itself (an already
    batched dataset has an unknown axis 0). Called with the dataset's `element_spec`."""
    if not isinstance(element_spec, tuple) or len(element_spec) != 2:
      raise DataError(f"{self.where}: the dataset's elements must be (features, labels) "
                      f"pairs, got {element_spec}")
    features, labels = element_spec
    if isinstance(labels, (dict, tuple, list)):
      _check_labels(self.where, labels)
    leaves = {**{_describe(k): v for k, v in _leaves(features).items()},
              **_label_leaves(labels)}
    shapes = {}
    for name, spec in leaves.items():
      if type(spec).__name__ != "TensorSpec":
        raise DataError(f"{self.where}: {name} is a {type(spec).__name__}; distloop batches "
                        f"dense tensors: make each example dense in the dataset (e.g. "
                        f".to_tensor() for a ragged one; with data.pad_to=longest distloop "
                        f"pads lengths that vary per batch)")
      if spec.shape.rank is None:
        raise DataError(f"{self.where}: {name} has an unknown rank; give every example one "
                        f"fixed shape in the dataset (e.g. tf.ensure_shape or set_shape)")
      shapes[name] = spec.shape.as_list()
    if all(shape and shape[0] is None for shape in shapes.values()):
      raise DataError(f"{self.where}: the dataset looks batched already (axis 0 of every "
                      f"element is unknown: {_shapes(shapes)}); return it unbatched "
                      f"(dataset.unbatch()): distloop batches the examples itself")
    for name, shape in shapes.items():
      if None in shape and self.padding is None:
        raise DataError(f"{self.where}: {name} has shape {_shape(shape)} per example: "
                        f"its size varies from example to example; set data.pad_to=longest "
                        f"to pad each batch to its longest example (sequences; data.pad_value "
                        f"fills it), or give every example one shape in the dataset (e.g. "
                        f"tf.image.resize for images)")


def _shape(shape: list) -> str:
  return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"


def _shapes(shapes: dict) -> str:
  return ", ".join(f"{name} {_shape(shape)}" for name, shape in shapes.items())


def as_source(value, where: str, padding: padding_lib.Padding | None = None) -> Source:
  """Wraps a builder's split in the matching form; DataError naming `where` otherwise.
  `padding` (data.pad_to): how variable-length examples are padded; None refuses them."""
  if isinstance(value, Source):
    return value
  if isinstance(value, tuple) and len(value) == 2:
    return ArraySource(value[0], value[1], where=where, padding=padding)
  if hasattr(value, "__len__") and hasattr(value, "__getitem__") and not isinstance(
      value, (list, dict, str, np.ndarray)):
    return IndexedSource(value, where=where, padding=padding)
  if callable(value):
    return StreamSource(value, where=where, padding=padding)
  raise DataError(f"{where}: a split must be (features, labels) arrays, a random-access "
                  f"source (__len__ and __getitem__) or a callable returning a "
                  f"tf.data.Dataset; got {type(value).__name__}")


def as_splits(value, where: str,
              padding: padding_lib.Padding | None = None) -> tuple[Source, Source]:
  if not isinstance(value, (tuple, list)) or len(value) != 2:
    raise DataError(f"{where} must return (train, eval), two splits, got "
                    f"{_kinds(value)}; {_SPLIT_FORMS}")
  if all(isinstance(split, np.ndarray) for split in value):
    raise DataError(f"{where} must return (train, eval), two splits, got (ndarray, ndarray): "
                    f"one split's (features, labels)? Return ((x_train, y_train), "
                    f"(x_eval, y_eval)); {_SPLIT_FORMS}")
  train = as_source(value[0], f"{where} train split", padding)
  evaluation = as_source(value[1], f"{where} eval split", padding)
  keys = train.label_keys(), evaluation.label_keys()
  if ... not in keys and keys[0] != keys[1]:
    described = [f"a dict ({', '.join(k)})" if k else "one array" for k in keys]
    raise DataError(f"{where}: the train split's labels are {described[0]}, the eval "
                    f"split's {described[1]}; both splits need the same labels")
  return train, evaluation


_SPLIT_FORMS = ("each split is (features, labels) numpy arrays, a random-access source "
                "(__len__ and __getitem__) or a callable returning a tf.data.Dataset")


def _kinds(value) -> str:
  if isinstance(value, (tuple, list)) and len(value) <= 4:
    inner = ", ".join(type(v).__name__ for v in value)
    return f"({inner})" if isinstance(value, tuple) else f"[{inner}]"
  return type(value).__name__


def _examples_or_value(value):
  """A list of per-example arrays as an object array; anything else as it is."""
  examples = padding_lib.as_examples(value) if isinstance(value, list) else None
  return value if examples is None else examples


def _variable_spec(where: str, name: str, value: np.ndarray, padding):
  """((None, *rest), dtype) of an object array of variable-length examples; DataError
  naming data.pad_to when it is not set, or naming the odd element."""
  if padding is None:
    raise DataError(f"{where}: {name} is an object array (examples of varying length?); "
                    f"set data.pad_to=longest to pad each batch to its longest example "
                    f"(data.pad_value fills it), or give every example one shape")
  return padding_lib.check_examples(where, name, value)


def _check_dtype(where: str, name: str, dtype: np.dtype) -> None:
  if dtype.kind not in "biuf" and dtype.kind != "S":
    raise DataError(f"{where}: {name} has dtype {dtype}; use numbers, booleans or bytes")


def _examples(indices: np.ndarray) -> str:
  """Which examples a read asked for: "example 7", "examples 3..9" (a run of them), or
  "12 examples among 0..9999" (a training batch: shuffled rows)."""
  if len(indices) == 0:
    return "no examples"
  if len(indices) == 1:
    return f"example {int(indices[0])}"
  first, last = int(indices[0]), int(indices[-1])
  if last - first == len(indices) - 1 and np.all(np.diff(indices) == 1):
    return f"examples {first}..{last}"
  return f"{len(indices)} examples among {int(np.min(indices))}..{int(np.max(indices))}"


def _largest_class_id(labels: np.ndarray, where: str) -> tuple[int, str] | None:
  """Integer class ids [N]: (largest + 1, what says so); None for other labels."""
  if labels.ndim != 1 or not labels.size or labels.dtype.kind not in "iu" or labels.min() < 0:
    return None
  count = int(labels.max()) + 1
  return count, f"{where}: largest label {count - 1}"


def _first_names(names) -> str:
  shown = ", ".join(map(str, list(names)[:5]))
  return shown + (", ..." if len(names) > 5 else "")


def _check_labels(where: str, labels) -> None:
  """Labels are one array per split (axis 0 = examples), or a dict of them keyed by
  output name (a multi-output model); a tuple or list is one line, not a numpy error."""
  if isinstance(labels, dict):
    if not labels:
      raise DataError(f"{where}: labels is an empty dict")
    bad = [key for key in labels if not isinstance(key, str)]
    if bad:
      raise DataError(f"{where}: labels is a dict with key {bad[0]!r}; its keys are the "
                      f"model's output names (strings)")
    return
  if isinstance(labels, (tuple, list)):
    raise DataError(f"{where}: labels are a {type(labels).__name__} of {len(labels)}; give "
                    f"one label array per split, or for a multi-output model a dict of "
                    f"label arrays keyed by output name")
