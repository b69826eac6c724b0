"""runtime.loggers' `wandb`: the run in Weights & Biases (`pip install -e '.[wandb]'`).

Through W&B's own API, not its Keras callbacks (they patch tf.keras, not Keras 3):
`wandb.init(id=..., resume="allow")` with the run id kept in model_dir/wandb_run.json
(a resumed distloop run is the same W&B run; the config is sent once, when the W&B run
is created), each split's values by `run.log({"train/loss": ...}, step=step)`, the
summary as the run's summary, and with `runtime.wandb_export=true` the SavedModel as a
`model` artifact. The project is `runtime.wandb_project`; the entity, the mode
(`WANDB_MODE=offline`), the folder (`WANDB_DIR`) and the key are W&B's own environment
variables. W&B cannot delete a step: trainer/reporters/fan_out.py hands it no step twice;
online, a resumed W&B run also says which steps it holds (`highest_steps`).
"""
import glob
import os
import struct
import uuid

from trainer.reporters.contract import Reporter
from trainer.store import files
from trainer.store import mirror


class WandbLog(Reporter):

  def __init__(self, runtime_config, model_dir: str):
    self._project = runtime_config.wandb_project
    self._export = runtime_config.wandb_export
    self._model_dir = model_dir
    self._run = None
    self._finished = False

  @property
  def run_id(self) -> str | None:
    return None if self._run is None else self._run.id

  def check(self) -> None:
    pass  # pylint: disable=g-import-not-at-top,unused-import  (optional extra)

  def start(self, config: dict, model_dir: str) -> None:
    import wandb  # pylint: disable=g-import-not-at-top  (optional extra)
    path = os.path.join(self._model_dir, "wandb_run.json")
    known = files.read_json(path) or {}
    run_id = known.get("run_id") or uuid.uuid4().hex[:16]
    name = os.path.basename(os.path.normpath(mirror.display(self._model_dir)))
    self._run = wandb.init(
        project=self._project, id=run_id, resume="allow", name=name,
        config=None if known else config, reinit="create_new",
        settings=wandb.Settings(console="off", x_disable_stats=True))
    if not known:
      files.write_json(path, {"run_id": run_id, "project": self._project},
                       what="the W&B run file")

  def highest_steps(self) -> dict | None:
    """{split: the highest step W&B holds}: online, what the resumed run says (it takes
    no step below its next); offline (where W&B ignores `resume`), what the earlier
    processes' transaction logs of this run id hold. W&B writes its log every 15 s:
    what a SIGKILLed process logged after that is not there, and is sent again."""
    if not self._run.offline:
      if not self._run.resumed or not self._run.starting_step:
        return {}
      return {"train": self._run.starting_step - 1, "eval": self._run.starting_step - 1}
    here = os.path.normpath(self._run.settings.sync_dir)
    logs = [path for path in glob.glob(os.path.join(
        os.path.dirname(here), f"*-{self._run.id}", f"run-{self._run.id}.wandb"))
            if os.path.dirname(path) != here]
    found = {}
    for path in logs:
      for split, step in history_steps(path):
        found[split] = max(step, found.get(split, -1))
    return found

  def write(self, step: int, split: str, values: dict) -> None:
    self._run.log({f"{split}/{name}": float(value) for name, value in values.items()}, step=step)

  def finish(self, summary: dict, export_dir: str | None) -> None:
    self._run.summary.update({key: value for key, value in summary.items()
                              if isinstance(value, (int, float, str, bool))})
    if self._export and export_dir and os.path.isdir(export_dir):
      import wandb  # pylint: disable=g-import-not-at-top  (optional extra)
      artifact = wandb.Artifact(f"{self._run.id}-export", type="model",
                                metadata={"step": os.path.basename(export_dir)})
      artifact.add_dir(export_dir)
      self._run.log_artifact(artifact)
    self._finished = True

  def close(self) -> None:
    """The W&B run ends: finished, or failed (marked preempting after a signal: the
    resumed run goes on in it)."""
    if self._run is None:
      return
    run, self._run = self._run, None
    from trainer.cluster import preemption  # pylint: disable=g-import-not-at-top
    if not self._finished and preemption.requested():
      run.mark_preempting()
    run.finish(exit_code=0 if self._finished else 1)


def records(path: str):
  """The records (serialized `wandb_internal_pb2.Record`) of a W&B transaction log
  (`run-ID.wandb`): LevelDB's log format, 32 KiB blocks of `crc (4), length (2), type
  (1), data` chunks (1 whole, 2 first, 3 middle, 4 last) after a 7-byte header. A file
  cut short (a killed process) ends at its last whole record."""
  with open(path, "rb") as f:
    data = f.read()
  if data[:4] != b":W&B":
    return
  at, parts = 7, []
  while at + 7 <= len(data):
    left = _BLOCK - at % _BLOCK
    _, length, kind = struct.unpack("<IHB", data[at:at + 7])
    if left < 7 or (kind == 0 and length == 0):  # a block's zero padding
      at += left
      continue
    chunk, at = data[at + 7:at + 7 + length], at + 7 + length
    if at > len(data):
      return
    if kind == 1:
      yield chunk
    elif kind == 2:
      parts = [chunk]
    elif kind == 3:
      parts.append(chunk)
    elif kind == 4:
      yield b"".join([*parts, chunk])


def history_steps(path: str):
  """(split, step) of each history row of a W&B transaction log holding a distloop
  value (`train/...`, `eval/...`)."""
  from wandb.proto import wandb_internal_pb2  # pylint: disable=g-import-not-at-top
  for data in records(path):
    record = wandb_internal_pb2.Record.FromString(data)
    if record.WhichOneof("record_type") != "history":
      continue
    splits = {(item.key or "/".join(item.nested_key)).split("/")[0]
              for item in record.history.item}
    for split in splits & {"train", "eval"}:
      yield split, record.history.step.num


_BLOCK = 32 * 1024
