"""How the suite is shared between pytest-xdist's workers, and says in pytest's summary
when multi-process tests were skipped, and why: without a private network namespace they
would run TensorFlow's gRPC servers on 0.0.0.0."""
import signal
import threading

import pytest

import trainer  # noqa: F401  first: it picks the CPU kernels before TensorFlow loads
from tests.support.processes import LOOPBACK_SKIP

# In-process runs share one TensorFlow runtime per test process, whose intra-op pool is
# fixed once it starts; runtime.deterministic runs need 1 thread per op (the size a fresh
# process gives them: trainer/cluster/runtime.py), and two test processes on 2 cores
# run best with one each. Subprocess runs choose their own.
from input_pipelines.native_output import native_startup_silenced  # pylint: disable=wrong-import-order
with native_startup_silenced():  # TensorFlow's C++ start-up lines, as the trainer hides them
  import tensorflow as tf  # pylint: disable=g-import-not-at-top,wrong-import-order
tf.config.threading.set_intra_op_parallelism_threads(1)


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(items):
  """The units of work of `--dist loadgroup` (setup.cfg): a test file, whose tests share its
  module fixtures and in-process TensorFlow runtime, except the guarantee matrix, whose
  cells share trained runs per (workload, shape) (tests/guarantees/conftest.py): each of
  those is a unit of its own, so both workers take part in the matrix (it was one file on
  one worker, the slow suite's longest unit). A run on a bucket (storage gs or s3) is
  read only by its own cells, in one group: they need the bucket's emulator, which each
  worker starts for itself."""
  for item in items:
    callspec = getattr(item, "callspec", None)
    if item.path.name == "test_matrix.py" and callspec is not None:
      group = f"matrix-{callspec.params['name']}-{callspec.params['shape']}"
      if callspec.params.get("storage", "local") != "local":
        group += f"-{callspec.params['storage']}"
    else:
      group = item.nodeid.split("::")[0]
    item.add_marker(pytest.mark.xdist_group(group))


def pytest_configure(config):
  """pytest stopped by SIGTERM ends as on Ctrl-C (KeyboardInterrupt where the test is):
  each test's `finally` blocks and the fixtures' teardowns kill the processes they started,
  and the kernel kills any left when pytest is gone (tests/support/processes.py,
  dies_with_its_test). SIGTERM's default ended pytest at once, its trainers orphaned."""
  del config
  if threading.current_thread() is threading.main_thread():
    signal.signal(signal.SIGTERM, _stop_as_on_ctrl_c)


def _stop_as_on_ctrl_c(signum, frame):
  del signum, frame
  raise KeyboardInterrupt("pytest received SIGTERM")


def pytest_terminal_summary(terminalreporter):
  skipped = [report for report in terminalreporter.stats.get("skipped", [])
             if LOOPBACK_SKIP in str(report.longrepr)]
  if skipped:
    reason = str(skipped[0].longrepr[-1]).removeprefix("Skipped: ")
    terminalreporter.write_sep("=", f"{len(skipped)} {reason}", yellow=True, bold=True)


# Object stores behind fault-injecting proxies, for gs:// and s3:// model_dirs (tests/support/object_stores.py)
from tests.support.object_stores import (  # noqa: F401,E402  pylint: disable=wrong-import-position,unused-import
    gcs_emulator, s3_emulator, gcs_store, s3_store, object_store, gcs_session_emulator,
    s3_session_emulator)
