"""The store's own record of what it put under a model_dir, for the audit that nothing
else does (tests/state/test_record_of_writes.py runs every mode and compares).

With DISTLOOP_STORE_RECORD=FILE, each path the store writes, commits, fetches from a
bucket, locks or hands to a library (orbax's steps, TensorBoard's event files, the
profiler's trace), and each object it puts in a bucket, is appended to FILE as one JSON
line: {"path", "how", "folder" (the record covers everything under it), "library",
"source" (the staged file an object was put from)}. Unset (the default) it costs one
look at the environment.
"""
import json
import os

VARIABLE = "DISTLOOP_STORE_RECORD"


def note(path: str, how: str, *, folder: bool = False, **more) -> None:
  record = os.environ.get(VARIABLE)
  if not record:
    return
  if "://" not in path:
    path = os.path.abspath(path)
  line = json.dumps({"path": path, "how": how, "folder": folder, **more}) + "\n"
  fd = os.open(record, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
  try:
    os.write(fd, line.encode("utf-8"))  # one write of one line: whole, whatever thread
  finally:
    os.close(fd)
