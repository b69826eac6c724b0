"""The workloads every guarantee is checked on: every module of workloads/ (one file per
workload: its `WORKLOAD` and the code only it uses), collected here in file-name order,
and the flags and step numbers every run shares (workload.py), as the checks read them."""
import importlib
import pkgutil

from tests.guarantees import workloads
from tests.guarantees.workload import (  # noqa: F401  (what the checks read as catalogue.X)
    CHANGED_AT, CHANGES, COMMON, ELASTIC_AT, EVAL_BATCH, EVALS, EVERY_CHECK, STEPS, Workload)

CATALOGUE: list[Workload] = [
    importlib.import_module(f"{workloads.__name__}.{module.name}").WORKLOAD
    for module in sorted(pkgutil.iter_modules(workloads.__path__), key=lambda m: m.name)]
BY_NAME = {workload.name: workload for workload in CATALOGUE}
assert len(BY_NAME) == len(CATALOGUE), "two workload files name the same workload"
