"""Model weights read from another run's checkpoint: checkpoint.init_from (a warm start,
whole or, with checkpoint.init_partial, only the variables whose name and shape match)
and a Task's BuildContext.load_weights (a frozen teacher).

Apart from trainer/state/checkpoints.py, which saves and restores this run's own steps:
here the source is any model_dir, its checkpoints/ or one checkpoints/<step>/, read once
through a read-only manager, and only the `model` item is read (never the optimizer's).
"""
import os

import numpy as np

from trainer.state import checkpoints
from trainer.store import mirror
from trainer.store import model_dir as layout
from trainer.errors import UserError


def read_model_weights(path: str, model_target: dict, *, partial: bool = False,
                       who: str = "checkpoint.init_from", ours: str = "this config",
                       advice: str | None = None) -> tuple[dict, str, list[str]]:
  """Model weights from a model_dir, its checkpoints/ or one checkpoints/<step>/ (warm start).

  Returns ({key: array} to load, the step directory read, what was skipped). Without
  `partial`, every key and shape must match (a mismatch: UserError naming the first
  and suggesting checkpoint.init_partial). With it, only the variables of
  `model_target` found there with their shape are returned (see `_matching`), the
  others listed as skipped (a new head); UserError if none matches. `who` starts each
  error (the field or call that asked), `ours` names the side being loaded, `advice`
  ends a mismatch's line.
  """
  path = os.path.abspath(mirror.staged_checkpoints(path, who))
  if os.path.isdir(layout.checkpoint_dir(path)):  # a model_dir
    path = layout.checkpoint_dir(path)
  step = None
  if os.path.isdir(os.path.join(path, "model")):  # one step directory
    path, step = os.path.split(path)
    step = int(step) if step.isdigit() else None
  source = checkpoints.Checkpoints(path, max_to_keep=1, async_save=False, writer=False)
  try:
    step = step if step is not None else source.latest_step()
    if step is None:
      raise UserError(f"{who}: no checkpoint in {path}")
    where = os.path.join(path, str(step))
    if partial:
      model_tree, skipped = _matching(where, source.restore_model_as_stored(step), model_target)
    else:
      model_tree, _, _ = source.restore(
          step, model_target, None, ours=ours, who=who,
          advice=advice or "to load only the weights whose name and shape match (fine-"
                           "tuning with a new head), set checkpoint.init_partial=true")
      model_tree, skipped = checkpoints.flatten(model_tree), []
  except checkpoints.CorruptCheckpoint as e:
    raise UserError(f"{who}: cannot read {e}") from None
  finally:
    source.close()
  return model_tree, where, skipped


def _matching(where: str, stored: dict, target: dict) -> tuple[dict, list[str]]:
  """(the flat {key: array} of `target`'s keys found in `stored` with their shape, the
  skipped keys with why).

  A key is `<model>/<layer>/.../<variable>` (trainer/state/keys.py). A model
  built by another builder may have another top-level name (`cnn` fine-tuned as
  `classifier`), so a key not found as it is is looked up by what follows the model
  name, where that part names one variable on each side.
  """
  wanted = checkpoints.flatten(target)
  def by_rest(keys):
    rests = {}
    for key in keys:
      rests.setdefault(key.split("/", 1)[-1], []).append(key)
    return {rest: keys[0] for rest, keys in rests.items() if len(keys) == 1}
  stored_by_rest, wanted_by_rest = by_rest(stored), by_rest(wanted)
  loaded, skipped = {}, []
  for key, value in wanted.items():
    rest = key.split("/", 1)[-1]
    found = key if key in stored else (
        stored_by_rest.get(rest) if wanted_by_rest.get(rest) == key else None)
    if found is None:
      skipped.append(f"{key} (not in the checkpoint)")
    elif tuple(np.shape(stored[found])) != tuple(np.shape(value)):
      skipped.append(f"{key} (shape {tuple(np.shape(stored[found]))} there, "
                     f"{tuple(np.shape(value))} here)")
    else:
      loaded[key] = stored[found]
  if not loaded:
    raise UserError(f"checkpoint.init_from: no variable of {where} matches this model by name "
                    f"and shape (e.g. {skipped[0] if skipped else 'this model has none'}); "
                    f"name your layers as in the model that wrote it")
  return loaded, skipped
