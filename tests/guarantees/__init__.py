"""The guarantee harness: a catalogue of small real workloads x every guarantee.

catalogue.py lists the workloads (`CATALOGUE`), test_matrix.py the checks, each run on
every workload on 1 and 2 replicas: a SIGTERM resume and a SIGKILL resume equal the
uninterrupted run (1e-6), 1 and 2 replicas agree with plain SGD (1e-5), eval at the end
= --mode=eval of the saved step = the export scored on the eval data (1e-5), and a
checkpoint of another workload is refused (exit 2, one line, nothing moved).
conftest.py trains each (workload, replicas) once per session and shares it.

To add a workload (a new feature): append one `Workload` to `CATALOGUE` with
- `flags`: the command line a user would run (plug-ins from tests/ or examples/; it
  should train with plain SGD, or give `sgd_flags` that make it so);
- `served(serve, replicas)`: the eval values scored from its export in numpy (None if it
  exports nothing that eval scores);
- `not_applicable` for a check that cannot hold by design (say why), and
  `known_defects` for a cell that fails on an open defect: it becomes xfail(strict), so
  the fix turns it into a failure until the entry is removed.
Every check then runs on it. `python -m pytest -m slow tests/guarantees` runs the
matrix; the fast suite runs the cells in test_matrix.FAST.
"""
