"""Model, loss, metrics and data must fit together: checked on real examples at start-up.

Runs once, eagerly, before the first step and before anything is written: the
model on a few training examples (which also builds a subclassed model's
variables), the loss and every metric on its outputs. A mismatch is a
UserError (exit 2) naming the plug-in and both shapes, instead of a shape
error from inside a compiled loop minutes later.
"""
import numpy as np
import tensorflow as tf

from input_pipelines.sources import ArraySource, IndexedSource, Source
from trainer import plugins
from trainer.errors import UserError


def check(config, model, loss_fn, metric_fns: dict, features, labels,
          train_source: Source, eval_source: Source) -> None:
  model_name = f"model.name={config.model.name!r}"
  try:
    outputs = model(features, training=False)
  except SystemExit as e:
    raise UserError(plugins.exit_message("model.name", config.model.name, e,
                                         " when called on a batch")) from None
  except Exception as e:  # pylint: disable=broad-except  (user models raise anything)
    raise UserError(f"{model_name} failed on a batch of the data ({type(e).__name__}: "
                    f"{_first_line(e)}); its input is {_describe(features)}") from None
  if not tf.is_tensor(outputs):
    raise UserError(f"{model_name} returns {type(outputs).__name__}; distloop's losses take "
                    f"one output tensor")
  outputs = tf.cast(outputs, tf.float32)
  batch = int(tf.shape(outputs)[0])
  loss_name = config.train.loss
  if outputs.shape.rank == 0 or batch != int(tf.shape(labels)[0]):
    raise UserError(f"{model_name} outputs {outputs.shape} for {int(tf.shape(labels)[0])} "
                    f"examples; axis 0 must be the batch")
  _check_outputs_fit_loss(loss_name, model_name, outputs, labels, train_source, eval_source)
  _check_per_example(f"train.loss={loss_name!r}", loss_fn, labels, outputs, batch)
  for name, fn in metric_fns.items():
    _check_per_example(f"eval.metrics ({name})", fn, labels, outputs, batch)


def _check_outputs_fit_loss(loss_name, model_name, outputs, labels, *sources) -> None:
  if loss_name == "sparse_categorical_crossentropy":
    if outputs.shape.rank != 2:
      raise UserError(f"{model_name} outputs shape {outputs.shape}; "
                      f"sparse_categorical_crossentropy needs [batch, classes] logits")
    num_classes = outputs.shape[-1]
    classes = getattr(getattr(sources[0], "source", None), "classes", None)
    if classes is not None and len(classes) != num_classes:
      raise UserError(f"{sources[0].where} has {len(classes)} classes "
                      f"({', '.join(map(str, classes[:5]))}{', ...' if len(classes) > 5 else ''})"
                      f" but {model_name} outputs {num_classes} (set model.num_classes="
                      f"{len(classes)}?)")
    for source, split_labels in _all_labels(sources, labels):
      if not (np.issubdtype(split_labels.dtype, np.integer)
              or np.all(np.mod(split_labels, 1) == 0)):
        raise UserError(f"{source.where}: labels must be class ids for "
                        f"sparse_categorical_crossentropy, got {split_labels.dtype}")
      if split_labels.size and (split_labels.min() < 0 or split_labels.max() >= num_classes):
        raise UserError(f"{source.where}: labels outside 0..{num_classes - 1} (found "
                        f"{split_labels.min()}..{split_labels.max()}), but {model_name} "
                        f"outputs {num_classes} classes (model.num_classes?)")
  elif loss_name in ("binary_crossentropy", "mean_squared_error", "mean_absolute_error"):
    label_shape = tuple(labels.shape)
    if len(label_shape) == outputs.shape.rank - 1 and outputs.shape[-1] == 1:
      label_shape += (1,)
    if label_shape[1:] != tuple(outputs.shape[1:]):
      raise UserError(f"{model_name} outputs {list(outputs.shape[1:])} per example, the labels "
                      f"are {list(labels.shape[1:])}: {loss_name} needs outputs of the labels' "
                      f"shape")
    if loss_name == "binary_crossentropy":
      for source, split_labels in _all_labels(sources, labels):
        if split_labels.size and (split_labels.min() < 0 or split_labels.max() > 1):
          raise UserError(f"{source.where}: labels outside [0, 1] for binary_crossentropy "
                          f"(found {split_labels.min()}..{split_labels.max()})")


def _all_labels(sources, probe_labels):
  """Every label of in-memory splits and of sources that list them (a `labels` array,
  as image_folder's do); the probe's for the others."""
  for source in sources:
    if isinstance(source, ArraySource):
      yield source, source.labels
    elif isinstance(source, IndexedSource) and isinstance(
        getattr(source.source, "labels", None), np.ndarray):
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
