"""A model_dir on a bucket (gs://, s3://), staged on the local disk.

Everything distloop writes goes first to a local staging directory, with the same
layout as a model_dir on disk (trainer/store/model_dir.py), so orbax, TensorBoard's
writer and the SavedModel exporter work there as they do on any disk; this module
then puts each finished piece in the bucket as whole objects, in an order that makes
what is in the bucket always a model_dir that can be resumed:

  a checkpoint step  its files, then the event files and metrics.csv as they are
                     now, then `checkpoints/<step>/commit_success.txt` last (orbax's
                     own commit marker on object stores), which lists the step's
                     files: a step without it, or without a file it lists, is never
                     listed, restored or kept (a save cut short, or a marker put by a
                     holder cut off after another trainer took over, leaves no step);
                     retention deletes a step's marker first
  a JSON file        one object (config.json, summary.json, finished.json, ...)
  an export          variables and assets first, `saved_model.pb` last: an export cut
                     short is no SavedModel at all
  metrics.csv, verify/digests.jsonl, TensorBoard's event files
                     whole objects, at each checkpoint and at the end; a resumed run
                     drops the rows past its step (metrics_log.restart_at) and writes
                     the file whole again, and drops the events past it from the event
                     files (summaries.restart_at: fetched, rewritten, put back whole): no
                     row or event lost or doubled

On start-up the committed steps, the JSON files and metrics.csv are copied down
(`staged`); a reader that polls (continuous_eval, the evaluator) calls `refresh`.
The staging directory is a cache: a new machine starts from the bucket alone. Log
lines and errors name the bucket's URL, never the staging path (`display`).

Only the holder of the writer lease writes checkpoints and logs
(trainer/store/lease.py); each worker of a multi-worker job stages its own copy.
"""
import atexit
import concurrent.futures
import json
import logging as std_logging
import os
import shutil
import tempfile
import threading
import time

from absl import logging

from trainer.store import object_stores
from trainer.store import record

COMMIT_MARKER = "commit_success.txt"
_STEP_DIRECTORIES = ("checkpoints", "checkpoints_best")
_LOGS = ("metrics.csv", "verify/digests.jsonl")  # files that grow by whole lines
_LOG_DIRECTORIES = ("tensorboard",)
_DOWNLOADING = ".orbax-checkpoint-tmp-download"  # a name orbax and distloop skip as unfinished
_UPLOADS = 8  # files of a step put in the bucket at once
_MIRRORS: dict[str, "Mirror"] = {}  # staging directory -> its mirror
_LOCK = threading.Lock()
_REMOVED_AT_EXIT: list = []  # remove_staging registered with atexit (once)


class Mirror:
  """One bucket model_dir and its staging directory (`local`)."""

  def __init__(self, url: str, bucket: object_stores.Bucket, prefix: str, local: str):
    self.url = url.rstrip("/")
    self.bucket = bucket
    self.prefix = prefix
    self.local = local
    self.created = False  # the bucket held nothing under this path when first staged
    self._pushed_logs: dict[str, tuple] = {}  # path -> (size, mtime) last put in the bucket
    self._log_lock = threading.Lock()  # the writer thread and the end of a run both push logs
    self.lease = None  # set by the writer lease: checked before each commit
    self._not_steps: set[tuple[str, str]] = set()  # markers whose files are missing, said once

  # Keys and paths.
  def key(self, path: str) -> str:
    relative = os.path.relpath(os.path.abspath(path), self.local).replace(os.sep, "/")
    return f"{self.prefix}/{relative}" if self.prefix else relative

  def _path(self, key: str) -> str:
    relative = key[len(self.prefix) + 1:] if self.prefix else key
    return os.path.join(self.local, *relative.split("/"))

  def url_of(self, path: str) -> str:
    return self.bucket.url(self.key(path))

  def _keys(self, under: str = "") -> list[str]:
    base = f"{self.prefix}/{under}" if self.prefix else under
    return self.bucket.list(base.rstrip("/") + "/" if base else "")

  # Reading: the bucket -> the staging directory.
  def pull(self) -> None:
    """The staging directory := what the bucket holds that a run reads: the committed
    checkpoint steps, the JSON files, config_history/, metrics.csv; the names of the
    exports and of the steps set aside (their contents stay in the bucket)."""
    keys = self._keys()
    self.created = not keys
    relatives = [key[len(self.prefix) + 1:] if self.prefix else key for key in keys]
    self._pull_steps(relatives)
    for relative in relatives:
      top, _, rest = relative.partition("/")
      if (not rest and relative != ".lock") or relative in _LOGS:  # a file of model_dir's own
        self._download(relative)
        if relative in _LOGS:  # as the bucket has it: put back only once changed here
          path = os.path.join(self.local, relative)
          self._pushed_logs[path] = _signature(path)
      elif top == "config_history":
        self._download(relative)
      elif top == "export" and rest.endswith("/saved_model.pb") and rest.count("/") == 1:
        os.makedirs(os.path.join(self.local, "export", rest.split("/")[0]), exist_ok=True)
      elif top == "checkpoints_corrupt":
        os.makedirs(os.path.join(self.local, top, rest.split("/")[0]), exist_ok=True)
    for name in os.listdir(self.local) if os.path.isdir(self.local) else []:
      path = os.path.join(self.local, name)
      if os.path.isfile(path) and name not in relatives:
        os.remove(path)  # removed in the bucket (finished.json, by a run training again)

  def refresh(self) -> None:
    """What a poller needs anew: the committed steps, finished.json, summary.json."""
    relatives = [key[len(self.prefix) + 1:] if self.prefix else key for key in self._keys()]
    self._pull_steps(relatives)
    for name in ("finished.json", "summary.json", "config.json", "run_id.json"):
      if name in relatives:
        self._download(name)
      elif os.path.exists(os.path.join(self.local, name)):
        os.remove(os.path.join(self.local, name))

  def pull_tree(self, directory: str) -> None:
    """Every object under `directory` (a predictions' folder) into the staging directory,
    but its lease: what a rerun goes on from."""
    under = os.path.relpath(os.path.abspath(directory), self.local).replace(os.sep, "/")
    for key in self._keys("" if under == "." else under):
      relative = key[len(self.prefix) + 1:] if self.prefix else key
      if relative.rsplit("/", 1)[-1] != ".lock":
        self._download(relative)

  def _pull_steps(self, relatives: list[str]) -> None:
    for directory in _STEP_DIRECTORIES:
      files: dict[str, list[str]] = {}
      for relative in relatives:
        parts = relative.split("/")
        if parts[0] == directory and len(parts) > 2 and parts[1].isdigit():
          files.setdefault(parts[1], []).append(relative)
      committed = {step for step, names in files.items()
                   if f"{directory}/{step}/{COMMIT_MARKER}" in names}
      local_directory = os.path.join(self.local, directory)
      here = set(os.listdir(local_directory)) if os.path.isdir(local_directory) else set()
      for step in sorted(committed - here, key=int):
        self._download_step(directory, step, files[step])
      for step in here - committed:
        if step.isdigit():  # deleted from the bucket (retention) since it was staged
          shutil.rmtree(os.path.join(local_directory, step), ignore_errors=True)

  def _download_step(self, directory: str, step: str, relatives: list[str]) -> None:
    """A committed step, whole, under a temporary name first: a download cut short is
    never taken for a step, nor is a step missing a file its marker lists."""
    final = os.path.join(self.local, directory, step)
    partial = final + _DOWNLOADING
    shutil.rmtree(partial, ignore_errors=True)
    with concurrent.futures.ThreadPoolExecutor(_UPLOADS) as pool:
      for done in [pool.submit(self._download, relative, os.path.join(
          partial, *relative[len(f"{directory}/{step}/"):].split("/")))
                   for relative in relatives]:
        done.result()
    missing = _missing_files(partial)
    if missing:
      shutil.rmtree(partial, ignore_errors=True)
      if (directory, step) in self._not_steps:
        return
      self._not_steps.add((directory, step))
      logging.warning("%s/%s/%s: its commit marker lists files the bucket does not hold "
                      "(%s): not a step", self.url, directory, step, ", ".join(missing[:3]))
      return
    os.replace(partial, final)
    record.note(final, "fetched", folder=True)

  def _download(self, relative: str, path: str | None = None) -> None:
    path = path or os.path.join(self.local, *relative.split("/"))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    self.bucket.download(f"{self.prefix}/{relative}" if self.prefix else relative,
                         path + ".download")
    os.replace(path + ".download", path)
    record.note(path, "fetched")

  # Writing: the staging directory -> the bucket.
  def _still_the_writer(self) -> None:
    """StorageError once the writer lease is lost (taken over, or not renewed for
    lease_seconds): a writer that lost it writes and deletes nothing more."""
    if self.lease is not None:
      self.lease.check()

  def push_file(self, path: str) -> None:
    """One file as one object (a reader sees the old one or the new one)."""
    self._still_the_writer()
    self.bucket.upload(self.key(path), path)
    record.note(self.url_of(path), "put", source=os.path.abspath(path))

  def remove(self, path: str) -> None:
    self._still_the_writer()
    self.bucket.delete(self.key(path))

  def push_tree(self, directory: str, last: tuple[str, ...] = (),
                skip: tuple[str, ...] = ()) -> None:
    """Every file under `directory` but the paths in `skip`, _UPLOADS at a time (a step
    has ~20 files: one by one, a request's latency each); those named in `last` once all
    the others are there."""
    files = [os.path.join(parent, name) for parent, _, names in os.walk(directory)
             for name in names if os.path.join(parent, name) not in skip]
    first = [path for path in files if os.path.basename(path) not in last]
    with concurrent.futures.ThreadPoolExecutor(_UPLOADS) as pool:
      for done in [pool.submit(self.push_file, path) for path in first]:
        done.result()  # the first failure, after the others ended
    for path in files:
      if os.path.basename(path) in last:
        self.push_file(path)

  def commit_step(self, directory: str, step: int) -> None:
    """Step `step` of `directory` (checkpoints/ or checkpoints_best/), saved in the
    staging directory: its files, the logs, then its commit marker; then the steps
    retention removed here are removed in the bucket (marker first)."""
    step_dir = os.path.join(directory, str(step))
    marker = os.path.join(step_dir, COMMIT_MARKER)
    # orbax writes its own marker there too: put it now and the step counts before its files
    self.push_tree(step_dir, skip=(marker,))
    self.push_logs()
    self._still_the_writer()  # another trainer took model_dir over: commit nothing more
    files = sorted(os.path.relpath(os.path.join(parent, name), step_dir).replace(os.sep, "/")
                   for parent, _, names in os.walk(step_dir) for name in names
                   if os.path.join(parent, name) != marker)
    self.bucket.write(self.key(marker), json.dumps({
        "step": step, "committed": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "files": files}).encode())
    record.note(self.url_of(marker), "put", source=os.path.abspath(marker))
    self.forget_steps(directory)

  def forget_steps(self, directory: str) -> None:
    """Removes from the bucket the steps of `directory` that are not in the staging
    directory (retention, a step set aside, a save cut short): the marker first, so a
    deletion cut short leaves no step that looks committed."""
    self._still_the_writer()  # the steps are another writer's now
    here = set(os.listdir(directory)) if os.path.isdir(directory) else set()
    steps: dict[str, list[str]] = {}
    for key in self._keys(os.path.basename(directory)):
      parts = key[len(self.key(directory)) + 1:].split("/")
      if parts[0].isdigit():
        steps.setdefault(parts[0], []).append(key)
    for step, keys in steps.items():
      if step in here:
        continue
      marker = [key for key in keys if key.endswith("/" + COMMIT_MARKER)]
      for key in marker:  # first: from here on the step is not one
        self.bucket.delete(key)
      with concurrent.futures.ThreadPoolExecutor(_UPLOADS) as pool:
        for done in [pool.submit(self.bucket.delete, key) for key in keys if key not in marker]:
          done.result()

  def push_logs(self) -> None:
    """metrics.csv and the event files that changed since last put, each whole."""
    self._still_the_writer()  # not over the logs of the trainer that took over
    with self._log_lock:
      paths = [os.path.join(self.local, name) for name in _LOGS]
      for name in _LOG_DIRECTORIES:
        for parent, _, names in os.walk(os.path.join(self.local, name)):
          paths += [os.path.join(parent, file) for file in names]
      for path in paths:
        if not os.path.exists(path):
          continue
        signature = _signature(path)
        if self._pushed_logs.get(path) == signature:
          continue
        with open(path, "rb") as f:
          data = f.read()
        if os.path.relpath(path, self.local) in _LOGS:  # whole lines: one may be half appended
          data = data[:data.rfind(b"\n") + 1]
        self.bucket.write(self.key(path), data)
        record.note(self.url_of(path), "put", source=path)
        self._pushed_logs[path] = signature

  def pull_logs(self, directory: str) -> None:
    """The event files directly under `directory` (tensorboard/train, say) that the
    bucket holds and the staging directory has not: downloaded, and counted as put in
    the bucket as they are (a resumed run drops the events past its step from them)."""
    with self._log_lock:
      under = os.path.relpath(directory, self.local).replace(os.sep, "/")
      for key in self._keys(under):
        path = self._path(key)
        if os.path.dirname(path) != os.path.abspath(directory) or path in self._pushed_logs:
          continue
        self._download(key[len(self.prefix) + 1:] if self.prefix else key, path)
        info = os.stat(path)
        self._pushed_logs[path] = (info.st_size, info.st_mtime_ns)

  def remove_everything(self) -> None:
    """A refused run on a path that held nothing: what it put there goes (the lease
    keeps anyone else from writing meanwhile)."""
    for key in self._keys():
      if not key.endswith("/.lock") and key != ".lock":
        self.bucket.delete(key)


def _missing_files(step_dir: str) -> list[str]:
  """The files the commit marker in `step_dir` lists that are not there. A marker that
  lists none (orbax's own, or distloop's before it listed them) asks for the step's
  checkpoint metadata at least."""
  try:
    with open(os.path.join(step_dir, COMMIT_MARKER), "rb") as f:
      files = json.loads(f.read().decode("utf-8"))["files"]
  except (OSError, ValueError, KeyError, TypeError):
    files = ["_CHECKPOINT_METADATA"]
  return [name for name in files
          if not os.path.isfile(os.path.join(step_dir, *str(name).split("/")))]


def _signature(path: str) -> tuple:
  info = os.stat(path)
  return info.st_size, info.st_mtime_ns


def staged(path: str, what: str = "--model_dir", *, fresh: bool = True) -> str:
  """`path` itself if it is local; for a gs:// or s3:// URL, its staging directory,
  pulled from the bucket (the same one for the same URL in this process: pulled again
  if `fresh`). UserError for a URL distloop cannot use: another scheme, no bucket
  name, no such bucket, a denied credential."""
  if not object_stores.is_url(path):
    return path
  scheme, name, prefix = object_stores.parse(path, what)
  url = f"{scheme}://{name}/{prefix}" if prefix else f"{scheme}://{name}"
  with _LOCK:
    for mirror in _MIRRORS.values():
      if mirror.url == url:
        if fresh:
          mirror.pull()
        return mirror.local
    bucket = object_stores.open_bucket(url, what)
    bucket.check(f"{what}={url}")
    local = tempfile.mkdtemp(prefix=f"distloop-{scheme}-{name}-")
    mirror = Mirror(url, bucket, prefix, local)
    try:
      mirror.pull()
    except object_stores.BucketError as e:
      shutil.rmtree(local, ignore_errors=True)
      if e.permanent:
        raise object_stores.UserError(f"{what}={url}: {e}") from None
      raise
    if not _MIRRORS:
      logging.get_absl_logger().addFilter(_UrlsShown())
      if not _REMOVED_AT_EXIT:  # an exit other than the CLI's _leave (a refused flag)
        atexit.register(remove_staging)
        _REMOVED_AT_EXIT.append(True)
    _MIRRORS[local] = mirror
    logging.info("%s %s: staged in %s (a local cache of what the bucket holds)",
                 what.lstrip("-"), url, local)
    return local


def staged_checkpoints(path: str, what: str) -> str:
  """A model_dir, its checkpoints/ or one checkpoints/<step> (checkpoint.init_from,
  load_weights), staged as `staged` does when it is a URL."""
  if not object_stores.is_url(path):
    return path
  scheme, name, prefix = object_stores.parse(path, what)
  parts = prefix.split("/") if prefix else []
  tail = []
  if len(parts) >= 2 and parts[-1].isdigit() and parts[-2] in _STEP_DIRECTORIES:
    parts, tail = parts[:-2], parts[-2:]
  elif parts and parts[-1] in _STEP_DIRECTORIES:
    parts, tail = parts[:-1], parts[-1:]
  root = staged(f"{scheme}://{name}/{'/'.join(parts)}", what, fresh=False)
  return os.path.join(root, *tail)


def of(path: str) -> Mirror | None:
  """The mirror whose staging directory holds `path`, if any."""
  path = os.path.abspath(str(path))
  for local, mirror in list(_MIRRORS.items()):
    if path == local or path.startswith(local + os.sep):
      return mirror
  return None


def display(text: str) -> str:
  """`text` with each staging directory written as its bucket's URL."""
  for local, mirror in list(_MIRRORS.items()):
    if local in text:
      text = text.replace(local, mirror.url)
  return text


class _UrlsShown(std_logging.Filter):
  """Log lines name a bucket model_dir by its URL (the staging path means nothing to
  whoever reads them)."""

  def filter(self, record):
    if _MIRRORS:
      message = record.getMessage()
      shown = display(message)
      if shown != message:
        record.msg, record.args = shown, None
    return True


def remove_staging() -> None:
  """Removes every staging directory (the process is done with them)."""
  with _LOCK:
    for local in list(_MIRRORS):
      shutil.rmtree(local, ignore_errors=True)
      del _MIRRORS[local]
