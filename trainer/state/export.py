"""SavedModel export: model_dir/export/<step>/, signature `serving_default`.

Inputs come from the features' spec as the model sees them: a dict's keys
become the input names; a bare array is one input named after its source
(`images` for the MNIST family, `inputs` otherwise). The output follows the
loss: `probabilities` for the cross-entropies (the softmax / sigmoid of logits, or
the outputs unchanged when they are probabilities already: train.from_logits),
`predictions` (the raw outputs) for anything else. A multi-output model serves
each output under its own name, by the same rule (trainer/setup/heads.py). The export is built from the
checkpointed weights in a plain (undistributed) copy of the model, so it loads
anywhere TensorFlow runs without distloop, and is written to a temporary
directory and renamed: a crash never leaves half an export, and a full disk or
a denied write removes the temporary and raises StorageError (one line).

Before the rename the temporary is loaded back and served real examples (the
probe batch), shorter and longer along every dimension that varies in the data
(None in the features' spec: data.pad_to), and compared with the model: an
export that is not the model (a signature fixed at one length) is refused in one
line (`check_served`), never written.
"""

import keras
import numpy as np
import tensorflow as tf

from input_pipelines import autograph_scope
from trainer.cluster import sharding
from trainer.errors import Preempted, UserError
from trainer.task import user_code
from trainer.store import files
from trainer.store import storage

# Served = the model's outputs, relative to max(1, |output|): the graph and the eager
# call may order sums apart (oneDNN fusions, cuDNN's choice of algorithm), units of the
# compute dtype's last place compounded over the layers (TF32: float32 matmuls on a GPU
# round to 10 bits). Measured: 4.5 units (0.0044) on tests/loop/test_precision.py's float16
# CNN. A served function that is not the model (a truncated length) is off by far more.
_TOLERANCE = {"float16": 16 * 2.0 ** -10, "bfloat16": 16 * 2.0 ** -7, "tf32": 16 * 2.0 ** -10}


class _Serving(tf.Module):

  def __init__(self, model, output_name: str, transform):
    super().__init__()
    self.model = model
    self._output_name = output_name
    self._transform = transform
    # tf.saved_model.save also traces the functions the model holds: Keras's default
    # signature calls it without `training`, so RandomFlip, RandomRotation (training=True
    # by default) draw from their SeedGenerators, whose state TensorFlow's object graph
    # does not reach from the model (a SeedGenerator is no Trackable): held here, the save
    # finds it (a KeyError otherwise). A model without SeedGenerators adds nothing.
    unreachable = _unreachable_variables(model)
    if unreachable:
      self.seed_states = unreachable

  def serve(self, features):
    outputs = tf.nest.map_structure(lambda output: tf.cast(output, tf.float32),  # mixed
                                    self.model(features, training=False))    # precision
    served = autograph_scope.user_function(self._transform)(outputs)
    if isinstance(served, dict):  # several outputs, each under its name
      return served
    return {self._output_name: served}


def serving_function(served):
  """`serve(features) -> {name: outputs}`: what the SavedModel of `served` (an Export)
  computes, on the live model (--mode=predict's default columns)."""
  return _Serving(served.model, served.output_name, served.transform or tf.identity).serve


def _unreachable_variables(model) -> list:
  """The model's variables that its TensorFlow object graph does not hold (Keras's
  SeedGenerator states): a function that reads one cannot be saved from the model alone."""
  reachable = {id(node) for node in tf.train.TrackableView(model).descendants()}
  return [variable for variable in model.variables if id(variable) not in reachable]


def serving_spec(features_spec, feature_name: str):
  """The signature's input spec: named TensorSpecs with batch dimension None."""
  def named(spec, name):
    return tf.TensorSpec([None, *spec.shape[1:]], spec.dtype, name=name)
  if isinstance(features_spec, dict):
    return {key: named(spec, key) for key, spec in features_spec.items()}
  return named(features_spec, feature_name)


def trace(served) -> None:
  """Traces what `served` serves (its model, transform and input_spec; nothing is
  written): the start-up check that an export after training can be made."""
  serving = _Serving(served.model, served.output_name, served.transform or tf.identity)
  tf.function(serving.serve, input_signature=[served.input_spec]).get_concrete_function()


def export_saved_model(served, destination: str, before_write=None, examples=None,
                       features_spec=None) -> None:
  """`served`: the task's Export (trainer/task/contract.py), its input_spec set;
  `before_write()` runs just before the SavedModel is written (the "export" phase).
  `examples` (a batch of features as the model sees them) and `features_spec` (None
  wherever the data varies) check what is written: `check_served`."""
  input_spec = served.input_spec
  varying = _fixed_where_data_varies(input_spec, features_spec)
  if varying:
    raise UserError(f"the export's input_spec fixes {varying}, a dimension whose length "
                    f"varies in the data (data.pad_to): it would serve other lengths "
                    f"wrongly; give it None there")
  weights = [sharding.to_numpy(variable) for variable in served.model.variables]
  model = _plain_copy(served, input_spec)
  if model is not served.model:
    for variable, value in zip(model.variables, weights, strict=True):
      variable.assign(value)
  serving = _Serving(model, served.output_name, served.transform or tf.identity)
  function = tf.function(serving.serve, input_signature=[input_spec])
  signatures = {"serving_default": function.get_concrete_function()}
  staged = destination + ".tmp"  # the exporter writes a folder; the store commits it
  needed_bytes = sum(int(getattr(w, "nbytes", 0)) for w in weights)
  files.discard(staged)
  try:
    if before_write is not None:
      before_write()
    tf.saved_model.save(serving, staged, signatures=signatures)
    check_served(staged, serving, input_spec, examples, features_spec)
  except Exception as e:  # pylint: disable=broad-except  (OSError or a TensorFlow OpError)
    files.discard(staged)
    if storage.reason(e) is None:
      raise
    raise storage.failure("the SavedModel export", destination, e,
                          needed_bytes=needed_bytes) from None
  # saved_model.pb last in a bucket: an upload cut short is no SavedModel
  files.commit(staged, destination, what="the SavedModel export", needed_bytes=needed_bytes,
               last=("saved_model.pb",))


def _plain_copy(served, input_spec):
  """A copy of the served model outside any strategy, so the SavedModel loads anywhere:
  the task's `build`, else keras.models.clone_model, else (a subclassed model) itself."""
  if served.build is not None:
    model = served.build(input_spec)
  else:
    try:
      model = keras.models.clone_model(served.model)
    except (ValueError, TypeError):  # subclassed: saved as it is
      return served.model
  if not model.variables:  # a subclassed model builds on its first call
    model(tf.nest.map_structure(lambda s: tf.zeros([1, *s.shape[1:]], s.dtype), input_spec),
          training=False)
  return model


def check_served(directory: str, serving: _Serving, input_spec, examples=None,
                 features_spec=None) -> None:
  """Loads the SavedModel written at `directory` and serves it inputs of several
  lengths along every dimension its signature leaves open (None past the batch) or
  the data varies in (None in `features_spec`):
  `examples` as they are, cut shorter, and repeated to more than twice their length
  (new content, not padding, past the examples' end); without `examples` of the
  signature's structure, inputs made from `input_spec`. Each served output must be
  the model's to 1e-5 (float16, bfloat16: 4 units in their last place; float32 on a
  GPU with TF32: 8 of its): UserError otherwise (nothing is exported)."""
  signature = tf.saved_model.load(directory).signatures["serving_default"]
  names = sorted(signature.structured_input_signature[1])
  specs = tf.nest.flatten(input_spec)
  if examples is None or not _fits(examples, input_spec):
    examples = tf.nest.pack_sequence_as(input_spec, [_made_up(spec) for spec in specs])
  open_spec = input_spec
  if _same_structure(input_spec, features_spec):  # the data's varying dims too
    open_spec = tf.nest.map_structure(_open, input_spec, features_spec)
  tolerance = _tolerance(serving.model)
  for what, inputs in _lengths(examples, open_spec):
    try:
      expected = serving.serve(inputs)
      got = signature(**dict(zip(names, tf.nest.flatten(inputs))))
    except (TypeError, ValueError, tf.errors.OpError) as e:
      raise UserError(f"the exported model fails on inputs {what}: "
                      f"{str(e).strip().splitlines()[0][:300]}") from None
    for name, value in expected.items():
      value, served_value = value.numpy(), got[name].numpy()
      difference = float(np.max(np.abs(served_value - value) / np.maximum(1.0, np.abs(value)),
                                initial=0.0)) if served_value.shape == value.shape else None
      if difference is None or not difference <= tolerance:
        said = (f"shape {list(served_value.shape)}, the model's {list(value.shape)}"
                if difference is None else f"{difference:.3g} off the model's")
        raise UserError(f"the exported SavedModel serves {name!r} {said} on inputs {what}: "
                        f"the export is not the model")


def _tolerance(model) -> float:
  dtype = str(getattr(model, "compute_dtype", ""))
  if dtype in _TOLERANCE:
    return _TOLERANCE[dtype]
  if (tf.config.list_logical_devices("GPU")
      and tf.config.experimental.tensor_float_32_execution_enabled()):
    return _TOLERANCE["tf32"]
  return 1e-5


def _lengths(examples, input_spec):
  """(words, inputs): `examples`, then per open dimension of each input shorter and longer."""
  yield f"of shape {_shapes(examples)}", examples
  leaves, specs = tf.nest.flatten(examples), tf.nest.flatten(input_spec)
  for i, spec in enumerate(specs):
    for axis in range(1, spec.shape.rank or 0):
      if spec.shape[axis] is not None:
        continue
      length = int(leaves[i].shape[axis])
      for new in (max(1, length // 2), 2 * length + 3):
        changed = list(leaves)
        array = np.asarray(leaves[i])
        repeats = -(-new // max(1, length))
        changed[i] = np.take(np.concatenate([array] * repeats, axis=axis), range(new), axis=axis)
        inputs = tf.nest.pack_sequence_as(examples, changed)
        yield f"of shape {_shapes(inputs)} (length {new} along axis {axis})", inputs


def _open(spec, data):
  """`spec` with None wherever `data` (the same input's spec in the data) has None."""
  if spec.shape.rank != data.shape.rank:
    return spec
  return tf.TensorSpec([s if d is not None else None for s, d in zip(spec.shape, data.shape)],
                       spec.dtype)


def _same_structure(input_spec, features_spec) -> bool:
  if features_spec is None:
    return False
  try:
    tf.nest.assert_same_structure(input_spec, features_spec)
  except (TypeError, ValueError):
    return False
  return True


def _shapes(inputs) -> str:
  return ", ".join(str(list(np.shape(leaf))) for leaf in tf.nest.flatten(inputs))


def _fits(examples, input_spec) -> bool:
  """Whether `examples` can be served as they are (the same structure, dtypes, ranks)."""
  try:
    tf.nest.assert_same_structure(examples, input_spec)
  except (TypeError, ValueError):
    return False
  return all(tf.as_dtype(leaf.dtype) == spec.dtype and spec.shape.rank == len(leaf.shape)
             and spec.shape[1:].is_compatible_with(leaf.shape[1:])
             for leaf, spec in zip(tf.nest.flatten(examples), tf.nest.flatten(input_spec)))


def _made_up(spec):
  """Two inputs of `spec`, 7 long in each open dimension: zeros (integers, indices in
  range), or a fixed normal draw (floats)."""
  shape = [2, *[7 if d is None else d for d in spec.shape[1:]]]
  if spec.dtype.is_floating:
    return tf.constant(np.random.default_rng(0).normal(size=shape), spec.dtype)
  return tf.zeros(shape, spec.dtype)


def _fixed_where_data_varies(input_spec, features_spec) -> str | None:
  """'dimension 1 of inputs (169)' where the served input fixes what the data leaves
  None; None if nothing (or the export serves something other than the features)."""
  if not _same_structure(input_spec, features_spec):
    return None
  for served, data in zip(tf.nest.flatten(input_spec), tf.nest.flatten(features_spec)):
    if served.shape.rank != data.shape.rank:
      continue
    for axis in range(1, data.shape.rank or 0):
      if data.shape[axis] is None and served.shape[axis] is not None:
        return f"dimension {axis} of {served.name or 'the input'} at {served.shape[axis]}"
  return None


def exported(task, default_spec, probe_features):
  """task.export() with its input_spec set (default: the data's), checked before
  training by tracing what it serves on `probe_features`' spec: a model that is not a
  keras.Model, or an input_spec the model cannot take, is one line (UserError).
  None if the task exports nothing."""
  name = type(task).__name__
  try:
    served = task.export()
  except (UserError, Preempted):
    raise
  except SystemExit as e:  # would end the run with its code, untrained and unsaid
    raise UserError(f"{name}.export called sys.exit({e.code!r}){user_code.location(e)}; export() must "
                    f"return a trainer.Export (or None) or raise") from None
  except Exception as e:  # pylint: disable=broad-except
    raise UserError(f"{name}.export raised {user_code.in_user_code(e)}") from None
  if served is None:
    return None
  if not isinstance(getattr(served, "model", None), keras.Model):
    raise UserError(f"{name}.export() serves {type(getattr(served, 'model', served)).__name__}"
                    f", not a keras.Model: trainer.Export(model=<a keras.Model>, ...)")
  if served.input_spec is None:
    served.input_spec = default_spec
  if type(task).__module__.startswith("trainer."):  # distloop's own (tested): no trace to pay
    return served
  try:
    trace(served)
  except (UserError, Preempted):
    raise
  except Exception as e:  # pylint: disable=broad-except
    spec = ", ".join(f"{tuple(s.shape)} {s.dtype.name}" for s in tf.nest.flatten(served.input_spec))
    data = ", ".join(f"{tuple(t.shape)} {t.dtype.name}" for t in tf.nest.flatten(probe_features))
    raise UserError(f"{name}.export() cannot be served with input_spec {spec} (the data's "
                    f"features: {data}): {user_code.in_user_code(e)}; refused before training, as the "
                    f"export runs after it") from None
  return served
