"""`train.from_logits`: whether the model's outputs are logits or probabilities.

Decided once, at start-up, from the model and its outputs on the probe
examples, and threaded from here to what depends on it: the cross-entropies
(trainer/supervised/losses.py), the accuracy thresholds (trainer/supervised/metrics.py) and the
served output (trainer/state/export.py). Most Keras models (every keras.applications
classifier, most tutorials) end in a softmax or sigmoid; the cross-entropies
take logits by default, so such a head would have its activation applied twice:
it still trains, exits 0, and serves "probabilities" that never reach 1.

    "auto":  a final softmax/sigmoid (a layer's activation, an Activation or
             Softmax layer, keras.ops.softmax/sigmoid) -> probabilities; a final
             layer with no activation -> logits; anything else (a subclassed
             model, another activation) -> logits unless the outputs look like
             probabilities, which is refused as ambiguous
    "true":  logits; refused for a final softmax/sigmoid
    "false": probabilities; refused for a final layer with no activation or
             outputs outside [0, 1]

Only the built-in cross-entropies read it; every other loss takes the outputs as
they are.
"""
from absl import logging
import numpy as np

from trainer.supervised import losses
from trainer.errors import UserError

CHOICES = ("auto", "true", "false")
_PROBABILITY_ACTIVATIONS = {"softmax": "softmax", "softmax_v2": "softmax", "sigmoid": "sigmoid"}
_NO_ACTIVATION = "linear"


def decide(config, model, outputs, *, loss_name: str | None = None,
           output: str | None = None) -> bool:
  """True if `outputs` (the model's, on the probe examples) are probabilities; UserError
  when the setting contradicts the model or the model cannot tell. `output`: which of a
  multi-output model's outputs (trainer/setup/heads.py), with its `loss_name`."""
  setting, loss_name = config.train.from_logits, loss_name or config.train.loss
  if not losses.is_cross_entropy(loss_name):
    return False
  final = final_activation(model, output)
  values = np.asarray(outputs, np.float64)
  where = f"model.name={config.model.name!r}" + (f" (output {output!r})" if output else "")
  if setting == "true":
    if final in _PROBABILITY_ACTIVATIONS.values():
      raise UserError(f"train.from_logits=true but {where} ends in a {final}: {loss_name} would "
                      f"apply it twice; set train.from_logits=false (or auto), or remove the "
                      f"final {final}")
    return False
  if setting == "false":
    if final == _NO_ACTIVATION:
      raise UserError(f"train.from_logits=false but {where} ends in a layer with no activation "
                      f"(logits); set train.from_logits=true (or auto), or end it in a "
                      f"softmax/sigmoid")
    if values.size and (values.min() < 0 or values.max() > 1):
      raise UserError(f"train.from_logits=false but {where} outputs values outside [0, 1] "
                      f"(found {values.min():.3g}..{values.max():.3g}); probabilities are in "
                      f"[0, 1]: set train.from_logits=true (or auto)")
    return True
  if final in _PROBABILITY_ACTIVATIONS.values():
    logging.info("%s ends in a %s: its outputs are probabilities, and %s takes them as such "
                 "(train.from_logits=auto)", where, final, loss_name)
    return True
  if final != _NO_ACTIVATION and _look_like_probabilities(values, outputs.dtype, loss_name):
    raise UserError(f"{where} outputs values that look like probabilities (all in [0, 1]"
                    f"{', rows summing to 1' if loss_name != 'binary_crossentropy' else ''}"
                    f") but distloop cannot see a final softmax or sigmoid: set "
                    f"train.from_logits=false if they are probabilities, true if they are logits")
  return False


def final_activation(model, output: str | None = None) -> str | None:
  """"softmax", "sigmoid", "linear" (no activation) or another name, for the layer that
  produces a functional or Sequential model's one output (or its output named `output`);
  None when it cannot be seen (a subclassed model) or is something else."""
  try:
    model_outputs = model.outputs
  except (AttributeError, ValueError):  # subclassed: no graph of layers to look at
    return None
  if output is not None:
    model_outputs = [_named_output(model, model_outputs, output)]
  if not model_outputs or len(model_outputs) != 1 or model_outputs[0] is None:
    return None
  history = getattr(model_outputs[0], "_keras_history", None)
  operation = getattr(history, "operation", None)
  if operation is None:
    return None
  if operation is not model and hasattr(operation, "outputs") and hasattr(operation, "layers"):
    return final_activation(operation)  # a nested model (a Sequential inside a functional one)
  kind = type(operation).__name__.lower()
  if kind in ("softmax", "sigmoid"):  # keras.layers.Softmax, keras.ops.softmax / sigmoid
    return kind
  activation = getattr(operation, "activation", None)
  if callable(activation):  # Dense, Conv, Activation, ...
    name = getattr(activation, "__name__", "")
    return _PROBABILITY_ACTIVATIONS.get(name, name or None)
  return None


def _named_output(model, model_outputs, output: str):
  """The symbolic output a functional model returns under `output` (a dict's key, or a
  list's entry in model.output_names); None when it cannot be told."""
  structure = getattr(model, "_outputs_struct", None)  # Keras 3 Functional: as returned
  if isinstance(structure, dict):
    return structure.get(output)
  names = list(getattr(model, "output_names", None) or [])
  if output in names and len(names) == len(model_outputs):
    return model_outputs[names.index(output)]
  return None


def _look_like_probabilities(values: np.ndarray, dtype, loss_name: str) -> bool:
  """sparse_categorical_crossentropy: every row in [0, 1] summing to 1 (logits almost
  never do); binary_crossentropy: every value strictly between 0 and 1 (at least 8 of
  them: 8 logits of a fresh model all land there about once in 256 runs)."""
  if values.ndim == 0 or values.size == 0 or values.min() < 0 or values.max() > 1:
    return False  # (a scalar output is refused by the start-up checks)
  if loss_name == "sparse_categorical_crossentropy":
    tolerance = 1e-3 if str(getattr(dtype, "name", dtype)) == "float32" else 2e-2
    return bool(np.all(np.abs(values.sum(axis=-1) - 1.0) <= tolerance))
  return values.size >= 8 and values.min() > 0 and values.max() < 1
