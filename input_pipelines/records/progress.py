"""A conversion's progress: DIR/progress.json, and the progress bar on stderr.

progress.json records the input's fingerprint, the records per shard of each
split (fixed by the first run) and every shard already written and verified,
so an interrupted conversion resumes shard by shard. It is rewritten
atomically after each shard and removed once manifest.json is written.
"""
import contextlib
import json
import os

from input_pipelines.errors import DataError

NAME = "progress.json"


class Progress:

  def __init__(self, directory: str, fingerprint: str, *, records_per_shard=None, done=None,
               created: bool):
    self.directory = directory
    self.fingerprint = fingerprint
    self.records_per_shard = dict(records_per_shard or {})
    self.done = dict(done or {})  # shard name -> {file, num_records, bytes, sha256}
    self.created = created  # this run makes the folder (so it may remove it on bad input)

  @classmethod
  def resume_or_start(cls, directory: str, fingerprint: str) -> "Progress":
    """The recorded progress of this input in `directory`, or a fresh start; DataError if
    the folder holds anything else (nothing is created here)."""
    path = os.path.join(directory, NAME)
    if not os.path.exists(directory):
      return cls(directory, fingerprint, created=True)
    if not os.path.isdir(directory):
      raise DataError(f"--output={directory} exists and is not a folder")
    if not os.path.isfile(path):
      if os.listdir(directory):
        raise DataError(f"--output={directory} exists, is not empty and holds no conversion "
                        f"in progress; the converter writes into a new or empty folder")
      return cls(directory, fingerprint, created=False)
    try:
      with open(path, encoding="utf-8") as f:
        state = json.load(f)
      recorded = state["fingerprint"]
    except (OSError, ValueError, KeyError, TypeError):
      raise DataError(f"{path}: unreadable; delete {directory} and convert again") from None
    if recorded != fingerprint:
      raise DataError(f"--output={directory} holds an unfinished conversion of another input "
                      f"(or of changed files); choose another --output or delete it")
    return cls(directory, fingerprint, records_per_shard=state.get("records_per_shard"),
               done=state.get("done"), created=False)

  def records_done(self, names: list[str]) -> int:
    return sum(self.done[name]["num_records"] for name in names if name in self.done)

  def make_directory(self) -> None:
    os.makedirs(self.directory, exist_ok=True)

  def finish(self, name: str, shard: dict) -> None:
    """Records a verified shard."""
    self.done[name] = shard
    path = os.path.join(self.directory, NAME)
    with open(path + ".tmp", "w", encoding="utf-8") as f:
      json.dump({"fingerprint": self.fingerprint, "records_per_shard": self.records_per_shard,
                 "done": self.done}, f, indent=1)
    os.replace(path + ".tmp", path)

  def remove(self) -> None:
    path = os.path.join(self.directory, NAME)
    if os.path.exists(path):
      os.remove(path)


class _NoBar:
  leave = True

  def update(self, n: int) -> None:
    pass

  def close(self) -> None:
    pass


def bar(total: int, initial: int, *, enabled: bool = True):
  """Counts, rate and ETA on stderr (tqdm)."""
  if not enabled:
    return _NoBar()
  from tqdm import tqdm  # pylint: disable=g-import-not-at-top
  return tqdm(total=total, initial=initial, unit="rec", unit_scale=True, mininterval=0.5,
              smoothing=0.1, desc="converting", dynamic_ncols=True)


class _FileBar:
  """A bar over a file's bytes: `reached(position)` moves it."""

  def __init__(self, bar):
    self.bar = bar

  def reached(self, position: int) -> None:
    if self.bar is not None:
      self.bar.update(max(0, min(position, self.bar.total) - self.bar.n))


@contextlib.contextmanager
def file_bar(path: str, verb: str, *, enabled: bool = True):
  """`verb FILE` with bytes, rate and ETA on stderr while the block reads the file; cleared
  when the block fails, so that a failure's one line stands alone."""
  if not enabled:
    yield _FileBar(None)
    return
  from tqdm import tqdm  # pylint: disable=g-import-not-at-top
  bar = tqdm(total=os.path.getsize(path), unit="B", unit_scale=True, mininterval=0.5,
             smoothing=0.1, desc=f"{verb} {os.path.basename(path)}", dynamic_ncols=True)
  try:
    yield _FileBar(bar)
  except BaseException:
    clear(bar)
    raise
  bar.close()


def clear(bar) -> None:
  """Closes a bar and wipes its line (a bar that is not shown is just closed)."""
  bar.leave = False
  bar.close()
