"""trainer/cluster/first_import.py: a process's first import of TensorFlow runs with the
cyclic garbage collector paused and is frozen after; the collector is always on again
after it (a training left without one grows by every reference cycle it makes).

In a fresh interpreter (no TensorFlow: the block imports a small module instead), so each
case is the process's first import; and in this process, where TensorFlow is imported.
"""
import gc
import subprocess
import sys

import pytest

from trainer.cluster import first_import

FIRST_IMPORT = """
import gc
from trainer.cluster import first_import
frozen_before = gc.get_freeze_count()
{setup}
try:
  with first_import.collector_paused():
    paused = not gc.isenabled()
    import json, email.mime.multipart  # stands in for TensorFlow
    {in_block}
except RuntimeError:
  pass
print(paused, gc.isenabled(), gc.get_freeze_count() > frozen_before)
"""


def first_import_in_a_fresh_process(setup: str = "", in_block: str = "pass") -> list[str]:
  code = FIRST_IMPORT.format(setup=setup, in_block=in_block)
  result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=True)
  return result.stdout.split()


def test_the_first_import_runs_uncollected_and_is_frozen_after():
  paused, enabled_after, frozen = first_import_in_a_fresh_process()
  assert (paused, enabled_after, frozen) == ("True", "True", "True")


def test_the_collector_is_on_again_when_the_import_fails():
  paused, enabled_after, frozen = first_import_in_a_fresh_process(
      in_block="raise RuntimeError('an import failed')")
  assert (paused, enabled_after, frozen) == ("True", "True", "False")


def test_a_collector_the_user_turned_off_stays_off_and_nothing_is_frozen():
  paused, enabled_after, frozen = first_import_in_a_fresh_process(setup="gc.disable()")
  assert (paused, enabled_after, frozen) == ("True", "False", "False")


@pytest.mark.filterwarnings("ignore")
def test_nothing_changes_once_tensorflow_is_imported():
  import tensorflow  # noqa: F401  (so this process's first import is behind it)
  frozen_before = gc.get_freeze_count()
  with first_import.collector_paused():
    assert gc.isenabled()
  assert gc.isenabled() and gc.get_freeze_count() == frozen_before
