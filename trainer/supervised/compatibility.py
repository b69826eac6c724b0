"""Model, loss, metrics and data must fit together: checked on real examples at start-up.

Runs once, eagerly, before the first step and before anything is written: the
model on a few training examples (which also builds a subclassed model's
variables), the loss and every metric on its outputs. A mismatch is a
UserError (exit 2) naming the plug-in and both shapes, instead of a shape
error from inside a compiled loop minutes later. So is a model that carries a
training configuration of its own (compile(), an overridden train_step): distloop
trains with its own step, optimizer and loss, and would ignore it.
"""
import keras
import numpy as np
import tensorflow as tf

import models
from input_pipelines.sources import ArraySource, IndexedSource, Source
from trainer.setup import plugins
from trainer.errors import UserError

# Optimizer settings worth naming even at their class's default (AdamW's weight_decay).
_OPTIMIZER_EXTRAS = ("weight_decay", "use_ema", "gradient_accumulation_steps", "clipnorm",
                     "global_clipnorm", "clipvalue")
# Methods of keras.Model that Model.fit() runs and distloop's own step replaces.
_STEP_METHODS = ("train_step", "test_step", "compute_loss")


def model_outputs(config, model, features):
  """The model's outputs on the probe features (this also builds a subclassed model),
  after refusing a model whose own training configuration distloop would ignore."""
  model_name = f"model.name={config.model.name!r}"
  _check_no_training_config_of_its_own(model_name, model)
  try:
    outputs = model(features, training=False)
  except SystemExit as e:
    raise UserError(plugins.exit_message("model.name", config.model.name, e,
                                         " when called on a batch")) from None
  except Exception as e:  # pylint: disable=broad-except  (user models raise anything)
    raise UserError(f"{model_name} failed on a batch of the data ({type(e).__name__}: "
                    f"{_first_line(e)}); its input is {_describe(features)}") from None
  parts = list(outputs.values()) if isinstance(outputs, dict) else (
      list(outputs) if isinstance(outputs, (list, tuple)) else [outputs])
  if not parts or not all(tf.is_tensor(part) for part in parts):
    raise UserError(f"{model_name} returns {type(outputs).__name__}; distloop's losses take "
                    f"one output tensor, or a dict or list of them (one per output)")
  return outputs


def check_labels_fit_outputs(config, names: list[str] | None, labels) -> None:
  """A multi-output model's labels are a dict with one entry per output name; a
  one-output model's are one array."""
  model_name = f"model.name={config.model.name!r}"
  if names is None and isinstance(labels, dict):
    raise UserError(f"the labels are a dict ({', '.join(sorted(labels))}) but {model_name} "
                    f"returns one tensor: return a dict of outputs with the same names, or "
                    f"give one label array")
  if names is not None:
    if not isinstance(labels, dict):
      raise UserError(f"{model_name} returns {len(names)} outputs ({', '.join(names)}) but the "
                      f"labels are one array: give a dict of labels keyed by output name")
    if set(labels) != set(names):
      raise UserError(f"{model_name} returns outputs {sorted(names)} but the labels are "
                      f"{sorted(labels)}: give one label array per output, keyed by its name")


def check(config, head, outputs, labels, train_source: Source, eval_source: Source) -> None:
  """`outputs`: head's outputs of the probe examples (model_outputs()) whose labels are
  `labels`; `head`: trainer/setup/heads.py Head (its loss and metrics)."""
  model_name = f"model.name={config.model.name!r}" + (
      f" (output {head.output!r})" if head.output else "")
  outputs = tf.cast(outputs, tf.float32)
  batch = int(tf.shape(outputs)[0]) if outputs.shape.rank else 0
  loss_name = head.loss_name
  if outputs.shape.rank == 0 or batch != int(tf.shape(labels)[0]):
    raise UserError(f"{model_name} outputs {outputs.shape} for {int(tf.shape(labels)[0])} "
                    f"examples; axis 0 must be the batch")
  _check_outputs_fit_loss(loss_name, model_name, outputs, labels, train_source, eval_source,
                          built_in=config.model.name in models.NAMES, key=head.output)
  loss_field = f"train.loss ({head.output}={loss_name})" if head.output else (
      f"train.loss={loss_name!r}")
  _check_per_example(loss_field, head.loss, labels, outputs, batch)
  for name, fn in head.metrics.items():
    _check_per_example(f"eval.metrics ({head.name(name)})", fn, labels, outputs, batch)


def _check_outputs_fit_loss(loss_name, model_name, outputs, labels, *sources,
                            built_in: bool, key: str | None = None) -> None:
  if loss_name == "sparse_categorical_crossentropy":
    if outputs.shape.rank != 2:
      raise UserError(f"{model_name} outputs shape {outputs.shape}; "
                      f"sparse_categorical_crossentropy needs [batch, classes] logits")
    num_classes = outputs.shape[-1]
    if num_classes == 1:  # a softmax over one output is always 1: nothing would learn
      raise UserError(f"{model_name} outputs one value per example; "
                      f"sparse_categorical_crossentropy needs one per class. For two classes "
                      f"(labels 0 and 1) set train.loss=binary_crossentropy"
                      + (", or set model.num_classes to the number of classes" if built_in
                         else ", or give the model's last layer one output per class"))
    classes = getattr(getattr(sources[0], "source", None), "classes", None)
    size_hint = (f"model.num_classes={len(classes) if classes is not None else ''}"
                 if built_in else "the units of the model's last layer")
    if classes is not None and len(classes) != num_classes:
      raise UserError(f"{sources[0].where} has {len(classes)} classes "
                      f"({', '.join(map(str, classes[:5]))}{', ...' if len(classes) > 5 else ''})"
                      f" but {model_name} outputs {num_classes} (set {size_hint}?)")
    for source, split_labels in _all_labels(sources, labels, key):
      if not (np.issubdtype(split_labels.dtype, np.integer)
              or np.all(np.mod(split_labels, 1) == 0)):
        raise UserError(f"{source.where}: labels must be class ids for "
                        f"sparse_categorical_crossentropy, got {split_labels.dtype}")
      if split_labels.size and (split_labels.min() < 0 or split_labels.max() >= num_classes):
        raise UserError(f"{source.where}: labels outside 0..{num_classes - 1} (found "
                        f"{split_labels.min()}..{split_labels.max()}), but {model_name} "
                        f"outputs {num_classes} classes "
                        f"({'model.num_classes' if built_in else 'its last layer'}?)")
  elif loss_name in ("binary_crossentropy", "mean_squared_error", "mean_absolute_error"):
    label_shape = tuple(labels.shape)
    if len(label_shape) == outputs.shape.rank - 1 and outputs.shape[-1] == 1:
      label_shape += (1,)
    if label_shape[1:] != tuple(outputs.shape[1:]):
      raise UserError(f"{model_name} outputs {list(outputs.shape[1:])} per example, the labels "
                      f"are {list(labels.shape[1:])}: {loss_name} needs outputs of the labels' "
                      f"shape")
    if loss_name == "binary_crossentropy":
      for source, split_labels in _all_labels(sources, labels, key):
        if split_labels.size and (split_labels.min() < 0 or split_labels.max() > 1):
          raise UserError(f"{source.where}: labels outside [0, 1] for binary_crossentropy "
                          f"(found {split_labels.min()}..{split_labels.max()})")


def _check_no_training_config_of_its_own(model_name: str, model) -> None:
  """compile() and an overridden train_step configure Model.fit(), which distloop does
  not run: refused rather than ignored."""
  overridden = [name for name in _STEP_METHODS
                if getattr(type(model), name, None) is not getattr(keras.Model, name)]
  if overridden:
    raise UserError(f"{model_name} returns a model that overrides {', '.join(overridden)}; "
                    f"distloop runs its own step and would ignore it (a custom step is not "
                    f"supported yet): train the model's plain call() with train.loss, "
                    f"train.optimizer and data.preprocess instead")
  if getattr(model, "compiled", False):
    ignored = []
    if getattr(model, "optimizer", None) is not None:
      ignored.append(f"the optimizer {_describe_optimizer(model.optimizer)}")
    if getattr(model, "loss", None) is not None:
      ignored.append(f"the loss {_describe_loss(model.loss)}")
    raise UserError(f"{model_name} returns a compiled model; distloop would ignore "
                    f"{' and '.join(ignored) or 'its compile() settings'}: remove the compile() "
                    f"call (keras.models.load_model(..., compile=False)) and set "
                    f"train.optimizer, train.learning_rate and train.loss instead")


def _describe_optimizer(optimizer) -> str:
  """AdamW(weight_decay=0.004, use_ema=True): the class, the settings distloop has no
  field for when they are on, and any other setting that differs from the class's
  defaults."""
  optimizer = getattr(optimizer, "inner_optimizer", optimizer)  # a LossScaleOptimizer's
  name = type(optimizer).__name__
  try:
    defaults = type(optimizer)().get_config()
    settings = optimizer.get_config()
  except Exception:  # pylint: disable=broad-except  (an optimizer with required arguments)
    return name
  changed = [f"{key}={_short(value)}" for key, value in settings.items()
             if key != "name" and (defaults.get(key) != value
                                   or (key in _OPTIMIZER_EXTRAS and value))]
  return f"{name}({', '.join(changed)})"


def _describe_loss(loss) -> str:
  if isinstance(loss, str):
    return repr(loss)
  return getattr(loss, "__name__", None) or type(loss).__name__


def _short(value) -> str:
  return f"{value:.4g}" if isinstance(value, float) else repr(value)


def _all_labels(sources, probe_labels, key: str | None = None):
  """Every label of in-memory splits and of sources that list them (a `labels` array,
  as image_folder's do); the probe's for the others. `key`: one output's labels."""
  for source in sources:
    if isinstance(source, ArraySource):
      yield source, source.labels[key] if key is not None else source.labels
    elif (key is None and isinstance(source, IndexedSource)
          and isinstance(getattr(source.source, "labels", None), np.ndarray)):
      yield source, source.source.labels
  yield sources[0], np.asarray(probe_labels)


def _check_per_example(what: str, fn, labels, outputs, batch: int) -> None:
  try:
    values = fn(labels, outputs)
  except SystemExit as e:
    raise UserError(f"{what} called sys.exit({e.code!r}); a plug-in must return its result "
                    f"or raise an exception, not end the process") from None
  except Exception as e:  # pylint: disable=broad-except
    raise UserError(f"{what} failed on outputs {outputs.shape} and labels {labels.shape} "
                    f"({type(e).__name__}: {_first_line(e)})") from None
  shape = tuple(getattr(values, "shape", ()))
  if shape != (batch,):
    raise UserError(f"{what} returned shape {list(shape)} for {batch} examples; it must "
                    f"return one value per example ([{batch}])")


def _describe(features) -> str:
  if isinstance(features, dict):
    return "{" + ", ".join(f"{k}: {v.dtype.name}{list(v.shape)}" for k, v in features.items()) + "}"
  return f"{features.dtype.name}{list(features.shape)}"


def _first_line(error: Exception) -> str:
  text = str(error).strip()
  return (text.splitlines()[0] if text else type(error).__name__)[:300]
