"""A process's first import of TensorFlow, without the garbage collector walking it.

Importing TensorFlow, Keras and orbax creates millions of objects, and Python's cyclic
collector, run every few hundred allocations, walks the young ones again and again and
the whole heap now and then: 17% of the import's CPU time (py-spy, 2026-12-07), and each
later full collection (tracing allocates enough to start several) walks every module once
more. So the first import runs with the collector paused, and what it created is then
frozen (`gc.freeze`: left out of later collections; reference counting still frees it).
A 1-step `python -m trainer` run: 1.12x less CPU (docs/performance.md), in every trainer process.

Nothing changes where TensorFlow is already imported (a test process, a notebook that
built its model first) or where the collector is off already (the user's choice).
"""
import contextlib
import gc
import sys


@contextlib.contextmanager
def collector_paused():
  """Runs the block (which imports TensorFlow) with the cyclic collector paused, then
  freezes what exists; a no-op after the process's first import of TensorFlow."""
  if "tensorflow" in sys.modules or not gc.isenabled():
    yield
    return
  gc.disable()
  try:
    yield
  finally:
    gc.enable()
  gc.freeze()
