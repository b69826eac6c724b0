"""runtime.loggers and the trackers' fields, checked before anything runs: a name that
is no logger, a tracker without its client (an optional extra) or its address, a local
MLflow store the installed client refuses. No TensorFlow, no tracker client imported."""
import importlib.util

from trainer.errors import UserError


def check_mlflow(config, field):
  uri = config.runtime.mlflow_uri
  if uri and importlib.util.find_spec("mlflow") is None:
    raise UserError(f"{field}={uri!r} needs the MLflow client: pip install -e '.[mlflow]' (or "
                    f"pip install mlflow-skinny)")
  if uri:
    _mlflow_store(uri)


LOGGERS = ("tensorboard", "csv", "mlflow", "wandb")  # runtime.loggers' built-ins


def selected_loggers(runtime_config) -> list[str]:
  """runtime.loggers' entries; `mlflow` is added where runtime.mlflow_uri is set."""
  names = [part.strip() for part in runtime_config.loggers.split(",") if part.strip()]
  if runtime_config.mlflow_uri and "mlflow" not in names:
    names.append("mlflow")
  return names


def check_loggers(config, field):
  """runtime.loggers: built-in names or MODULE:CLASS; the extras each one needs."""
  names = selected_loggers(config.runtime)
  for name in names:
    if name not in LOGGERS and ":" not in name:
      raise UserError(f"{field}={config.runtime.loggers!r}: {name!r} is unknown (choose from: "
                      f"{', '.join(LOGGERS)}, or MODULE:CLASS for your own)")
  if len(set(names)) < len(names):
    raise UserError(f"{field}={config.runtime.loggers!r} names a logger twice")
  if "mlflow" in names and not config.runtime.mlflow_uri:
    raise UserError(f"{field}={config.runtime.loggers!r}: mlflow needs runtime.mlflow_uri "
                    f"(http://HOST:PORT of a tracking server, or sqlite:///PATH/mlflow.db)")
  if "wandb" in names and importlib.util.find_spec("wandb") is None:
    raise UserError(f"{field}={config.runtime.loggers!r}: wandb needs the W&B client: "
                    f"pip install -e '.[wandb]' (or pip install wandb)")


_DATABASES = ("sqlite", "postgresql", "mysql", "mssql")


def _mlflow_store(uri: str) -> None:
  """A local store the installed client refuses, in one line naming what works: MLflow's
  file store is in maintenance mode (refused unless MLFLOW_ALLOW_FILE_STORE=true); a
  database needs the full `mlflow` package (mlflow-skinny has no SQLAlchemy)."""
  scheme = uri.split(":", 1)[0].split("+", 1)[0].lower() if ":" in uri else ""
  if scheme in ("file", "") or len(scheme) == 1:  # a path (or a Windows drive) is a file store
    from mlflow import environment_variables  # pylint: disable=g-import-not-at-top
    allowed = getattr(environment_variables, "MLFLOW_ALLOW_FILE_STORE", None)
    if allowed is not None and not allowed.get():
      raise UserError(f"runtime.mlflow_uri={uri!r}: MLflow's file store is in maintenance "
                      f"mode and the installed client refuses it; log locally to "
                      f"sqlite:///PATH/mlflow.db (pip install mlflow), or to a tracking "
                      f"server (mlflow server --backend-store-uri sqlite:///PATH/mlflow.db; "
                      f"runtime.mlflow_uri=http://127.0.0.1:5000), or set "
                      f"MLFLOW_ALLOW_FILE_STORE=true")
  if scheme in _DATABASES and importlib.util.find_spec("sqlalchemy") is None:
    raise UserError(f"runtime.mlflow_uri={uri!r}: a database store needs the full MLflow "
                    f"package (pip install mlflow); the mlflow-skinny client logs to a "
                    f"tracking server (http://HOST:PORT) only")
