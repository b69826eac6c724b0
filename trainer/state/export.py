"""SavedModel export: model_dir/export/<step>/, signature `serving_default`.

Inputs come from the features' spec as the model sees them: a dict's keys
become the input names; a bare array is one input named after its source
(`images` for the MNIST family, `inputs` otherwise). The output follows the
loss: `probabilities` for the cross-entropies (the softmax / sigmoid of logits, or
the outputs unchanged when they are probabilities already: train.from_logits),
`predictions` (the raw outputs) for anything else. A multi-output model serves
each output under its own name, by the same rule (trainer/task/heads.py). The export is built from the
checkpointed weights in a plain (undistributed) copy of the model, so it loads
anywhere TensorFlow runs without distloop, and is written to a temporary
directory and renamed: a crash never leaves half an export, and a full disk or
a denied write removes the temporary and raises StorageError (one line).
"""
import os
import shutil

import keras
import tensorflow as tf

from trainer.cluster import sharding
from trainer.state import storage


class _Serving(tf.Module):

  def __init__(self, model, output_name: str, transform):
    super().__init__()
    self.model = model
    self._output_name = output_name
    self._transform = transform

  def serve(self, features):
    outputs = tf.nest.map_structure(lambda output: tf.cast(output, tf.float32),  # mixed
                                    self.model(features, training=False))    # precision
    served = self._transform(outputs)
    if isinstance(served, dict):  # several outputs, each under its name
      return served
    return {self._output_name: served}


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


def export_saved_model(served, destination: str, before_write=None) -> None:
  """`served`: the task's Export (trainer/task/contract.py), its input_spec set;
  `before_write()` runs just before the SavedModel is written (the "export" phase)."""
  input_spec = served.input_spec
  weights = [sharding.to_numpy(variable) for variable in served.model.variables]
  model = _plain_copy(served, input_spec)
  if model is not served.model:
    for variable, value in zip(model.variables, weights, strict=True):
      variable.assign(value)
  serving = _Serving(model, served.output_name, served.transform or tf.identity)
  function = tf.function(serving.serve, input_signature=[input_spec])
  signatures = {"serving_default": function.get_concrete_function()}
  temporary = destination + ".tmp"
  shutil.rmtree(temporary, ignore_errors=True)
  try:
    if before_write is not None:
      before_write()
    tf.saved_model.save(serving, temporary, signatures=signatures)
    os.replace(temporary, destination)
  except Exception as e:  # pylint: disable=broad-except  (OSError or a TensorFlow OpError)
    if storage.reason(e) is None:
      raise
    shutil.rmtree(temporary, ignore_errors=True)
    raise storage.failure("the SavedModel export", destination, e,
                          needed_bytes=sum(int(getattr(w, "nbytes", 0)) for w in weights)
                          ) from None


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
