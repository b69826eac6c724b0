"""A moment to stop a trainer at, for tests of what a bucket holds after a kill
(tests/buckets/test_bucket_predict.py): with this folder on PYTHONPATH and
DISTLOOP_TEST_BEFORE_PUT=TEXT, the process stops just before it puts in the bucket the
first file whose path holds TEXT (written here, not there yet): DISTLOOP_TEST_THEN=kill
(the default) SIGKILLs itself; `pause` says so on stderr and sleeps, its lease renewed
meanwhile (a live writer). Python imports `sitecustomize` at start-up; without the
variable nothing is patched."""
import os
import signal
import sys
import time

_MATCH = os.environ.get("DISTLOOP_TEST_BEFORE_PUT")
if _MATCH:
  from trainer.store import mirror  # pylint: disable=g-import-not-at-top

  _push_file = mirror.Mirror.push_file

  def _stopping_push_file(self, path):
    if _MATCH in path.replace(os.sep, "/"):
      if os.environ.get("DISTLOOP_TEST_THEN", "kill") == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
      print(f"test paused before putting {_MATCH}", file=sys.stderr, flush=True)
      time.sleep(300)
    return _push_file(self, path)

  mirror.Mirror.push_file = _stopping_push_file
