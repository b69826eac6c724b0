"""The rows of the training split a past step read, per replica: `batch(model_dir, step)`
(the package's docstring says how), and `examples(found, rows)`, what they hold."""
import dataclasses
import json
import os
import re

import ml_collections
import numpy as np

from trainer.errors import UserError
from trainer.store import files
from trainer.store import model_dir as layout


@dataclasses.dataclass
class Batch:
  step: int
  examples_before: int        # the data position global batch `step` starts at
  global_batch_size: int
  replicas: int
  rows: list[list[int]]       # rows[r]: replica r's rows of the training split, in order
  source: object = dataclasses.field(repr=False)  # the training split, loaded once


def _history(model_dir: str) -> list[tuple[int, dict]]:
  """[(the step a run started at, its config)], in the order the runs started."""
  directory = layout.config_history_dir(model_dir)
  try:
    names = sorted(name for name in os.listdir(directory) if name.endswith(".json"))
  except OSError:
    names = []
  found = []
  for name in names:
    match = re.search(r"_step(\d+)\.json$", name)
    config = files.read_json(os.path.join(directory, name))
    if config is not None:
      found.append((int(match.group(1)) if match else 0, config))
  if not found:
    config = files.read_json(layout.config_path(model_dir))
    if config is None:
      raise UserError(f"{model_dir} holds no config.json: not a model_dir distloop trained")
    found.append((0, config))
  return found


def _config_of(history: list, step: int) -> dict:
  """The config that trained `step` (1-based): the latest run that started before it."""
  started = [config for start, config in history if start <= step - 1]
  return started[-1] if started else history[0][1]


def batch(model_dir: str, step: int) -> Batch:
  """Global batch `step`'s rows, per replica. UserError where they cannot be known."""
  if "://" in model_dir:
    raise UserError(f"--model_dir={model_dir}: inspect reads a local model_dir")
  if step < 1:
    raise UserError(f"--step={step}: steps count from 1 (global batch 1 trains step 1)")
  history = _history(model_dir)
  anchor, examples = layout.newest_data_position(model_dir, at_most=step - 1) or (0, 0)
  for trained in range(anchor + 1, step):
    examples += int(_config_of(history, trained)["train"]["global_batch_size"])
  config = _config_of(history, step)
  _refuse_what_has_no_rows(config)
  size = int(config["train"]["global_batch_size"])
  replicas = _replicas(model_dir, step)
  per_replica = size // replicas
  source = _train_source(config)
  positions = examples + np.arange(size, dtype=np.int64)
  from input_pipelines import order  # pylint: disable=import-outside-toplevel  (TensorFlow)
  rows = order.rows(positions, int(config["runtime"]["seed"]), len(source)).numpy()
  return Batch(step, examples, size, replicas,
               [rows[r * per_replica:(r + 1) * per_replica].tolist() for r in range(replicas)],
               source)


def examples(found: Batch, rows: list[int]):
  """(features, labels) of `rows` of the training split, as the source holds them."""
  return found.source.assemble(found.source.read_leaves(np.asarray(rows, np.int64)))


def _replicas(model_dir: str, step: int) -> int:
  """The replica count that trained `step`: the shape recorded by the nearest checkpoint
  (at or after it, else before)."""
  steps = layout.checkpoint_steps(model_dir)
  for kept in [s for s in steps if s >= step] + list(reversed([s for s in steps if s < step])):
    shape = (layout.step_meta(model_dir, kept) or {}).get("shape")
    if isinstance(shape, dict) and isinstance(shape.get("replicas"), int):
      return shape["replicas"]
  return 1


def _refuse_what_has_no_rows(config: dict) -> None:
  if config["runtime"]["strategy"] == "parameter_server":
    raise UserError("a parameter-server run's workers each read their own salted order: no "
                    "global batch to inspect")


def _train_source(config: dict):
  from trainer.setup import plugins  # pylint: disable=import-outside-toplevel  (TensorFlow)
  from input_pipelines import batching  # pylint: disable=import-outside-toplevel
  from input_pipelines.sources import StreamSource  # pylint: disable=import-outside-toplevel
  data = ml_collections.ConfigDict(config["data"])
  train, _ = plugins.load_data(data, int(config["runtime"]["seed"]))
  if isinstance(train, StreamSource):
    raise UserError(f"data.name={config['data']['name']} is a tf.data stream: its rows have "
                    f"no index to show")
  if batching.grouped_by_length(train):
    raise UserError("training batches grouped by length (data.bucket_window) are formed from "
                    "a window of batches: not yet inspectable by step (data.bucket_window=0 "
                    "makes them so)")
  return train


def as_json(found: Batch) -> str:
  return json.dumps({"step": found.step, "examples_before": found.examples_before,
                     "global_batch_size": found.global_batch_size,
                     "replicas": found.replicas, "rows": found.rows})
