"""The guarantee harness: a catalogue of small real workloads x every guarantee x every shape.

catalogue.py lists the workloads (`CATALOGUE`), conftest.py the shapes (`SHAPES`: 1
replica, 2 mirrored, 2 under central_storage, 1 with the whole step under XLA),
test_matrix.py the checks, each run on every workload on every shape: a SIGTERM resume
and a SIGKILL resume equal the uninterrupted run (1e-6), every shape agrees with 1
replica under plain SGD (1e-5), eval at the end = --mode=eval of the saved step = the
export scored on the eval data (1e-5), and a checkpoint of another workload is refused
(exit 2, one line, nothing moved). conftest.py trains each (workload, shape) once per
session and shares it. A new way to lay out a run is one more `SHAPES` entry.

To add a workload (a new feature): append one `Workload` to `CATALOGUE` with
- `flags`: the command line a user would run (plug-ins from tests/ or examples/; it
  should train with plain SGD, or give `sgd_flags` that make it so);
- `served(serve, replicas)`: the eval values scored from its export in numpy (None if it
  exports nothing that eval scores);
- `not_applicable` for a check that cannot hold by design (say why), and
  `known_defects` for a cell that fails on an open defect: it becomes xfail(strict), so
  the fix turns it into a failure until the entry is removed. Key either by check (every
  shape) or by (check, shape).
Every check then runs on it. `python -m pytest -m slow tests/guarantees` runs the
matrix; the fast suite runs the cells in test_matrix.FAST.
"""
