"""What eval and export see, and what export writes: the task's Export (its input spec
from the data, traced on the probe batch: UserError if it cannot be served), the moving
averages in place of the trained weights unless train.ema_eval=false, and the SavedModel
written once, by the chief, at export/<step>/.

Why apart from the controller: the flow says when it evaluates and exports; this says
with which weights, and what is written (the SavedModel itself: trainer/state/export.py).
"""
import contextlib
import os
from typing import Callable

from absl import logging

from trainer.state import export
from trainer.store import model_dir as layout


class Serving:
  """`features_spec`: the batches' (None wherever the data varies); `probe_features`: a
  few real training examples, which the export is checked on."""

  def __init__(self, config, task, state, *, model_dir: str, is_chief: bool, features_spec,
               feature_name: str, probe_features):
    self._config = config
    self._task = task
    self._state = state
    self._model_dir = model_dir
    self._is_chief = is_chief
    self._features_spec = features_spec
    self._feature_name = feature_name
    self._probe_features = probe_features

  def served(self):
    """The task's Export, its input_spec set and traced (UserError if it cannot be
    served); None if the task exports nothing."""
    return export.exported(
        self._task, export.serving_spec(self._features_spec, self._feature_name),
        self._probe_features)

  def weights(self):
    """What eval and export see: the moving averages (train.ema_decay, or an optimizer of
    the task with use_ema) unless train.ema_eval=false; training goes on from its own."""
    if self._config.train.ema_eval:
      return self._state.averaged_weights()
    return contextlib.nullcontext()

  def export(self, step: int, before_write: Callable[[], None]) -> str | None:
    """SavedModel of what the task serves at export/<step>/ (kept if it already exists);
    None if the task exports nothing. `before_write`: the "export" phase's Actions."""
    served = self.served()
    if served is None:
      return None
    destination = layout.export_dir(self._model_dir, step)
    if not self._is_chief or os.path.isdir(destination):
      return destination
    with self.weights():
      export.export_saved_model(served, destination, before_write=before_write,
                                examples=self._probe_features, features_spec=self._features_spec)
    logging.info("Exported SavedModel to %s", destination)
    return destination
