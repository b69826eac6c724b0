"""A debugging aid: which rows this process reads, so a test (or you) can check who reads what.

Set `DISTLOOP_DEBUG_READS=DIR` and every row an indexable source reads is
appended (int64, native order) to `DIR/<stream>.<task>.<pid>.rows`, where
stream is `train`, `eval` or `probe` (the start-up examples) and task is
`<type>-<index>` of TF_CONFIG (`local` without it). Off by default: unset, it
costs one dictionary lookup per batch.
"""
import json
import os
import threading

import numpy as np

ENV = "DISTLOOP_DEBUG_READS"
_LOCK = threading.Lock()


def record(stream: str, rows: np.ndarray) -> None:
  """Appends `rows` to this process's log of `stream`, if logging is on."""
  directory = os.environ.get(ENV)
  if not directory:
    return
  path = os.path.join(directory, f"{stream}.{_task()}.{os.getpid()}.rows")
  with _LOCK, open(path, "ab") as f:
    f.write(np.asarray(rows, dtype=np.int64).tobytes())


def load(directory: str) -> dict[tuple[str, str], np.ndarray]:
  """{(stream, task): every row read, in order} from a folder of logs."""
  logs = {}
  for name in sorted(os.listdir(directory)):
    if name.endswith(".rows"):
      stream, task, _, _ = name.split(".")
      rows = np.fromfile(os.path.join(directory, name), dtype=np.int64)
      logs[stream, task] = np.concatenate([logs.get((stream, task), rows[:0]), rows])
  return logs


def _task() -> str:
  try:
    task = json.loads(os.environ.get("TF_CONFIG") or "{}").get("task", {})
  except ValueError:
    task = {}
  return f"{task['type']}-{task['index']}" if "type" in task else "local"
