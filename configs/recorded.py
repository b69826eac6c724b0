"""The config a model_dir recorded, as a config file: `--config=DIR/config.json`.

The trainer writes the resolved config of every run to model_dir/config.json
(trainer/store/model_dir.py). `get_config(path)` reads it back as a locked ConfigDict
built on common.base_config(): every field exists (a field distloop added since
keeps its default), the values are the file's, and a user config's own fields
(examples/my_config.py) are kept. `--config.FIELD=VALUE` overrides apply on top.

The command line resolves `--config=DIR/config.json` to `configs/recorded.py:DIR/config.json`,
and uses it with no --config at all when model_dir holds a config.json
(trainer/cli/config_file.py), so eval, export, continuous_eval and a resume run the
model that was trained there without repeating its flags.
"""
import json

import ml_collections

from configs import common


def get_config(path: str) -> ml_collections.ConfigDict:
  try:
    with open(path) as f:
      recorded = json.load(f)
  except OSError as e:
    raise ValueError(f"cannot be read ({e.strerror})") from None
  except ValueError as e:
    raise ValueError(f"is not valid JSON ({e})") from None
  if not isinstance(recorded, dict):
    raise ValueError(f"holds a JSON {type(recorded).__name__}, not a config object")
  config = common.base_config()
  _merge(config, recorded, prefix="")
  config.lock()
  return config


def _merge(config: ml_collections.ConfigDict, values: dict, prefix: str) -> None:
  for key, value in values.items():
    field = prefix + key
    if isinstance(value, dict):
      if key not in config:
        config[key] = ml_collections.ConfigDict()
      if not isinstance(config[key], ml_collections.ConfigDict):
        raise ValueError(f"{field} is a section there, a single value in configs/common.py")
      _merge(config[key], value, prefix=field + ".")
      continue
    try:
      config[key] = value
    except TypeError:
      raise ValueError(f"{field}={value!r} must be of type {type(config[key]).__name__} "
                       f"(configs/common.py)") from None
