"""The guarantee harness: a catalogue of small real workloads x every guarantee x every shape.

workloads/ holds the workloads, one file each (catalogue.py collects them as
`CATALOGUE`; workload.py says what an entry is), conftest.py the shapes (`SHAPES`: 1
replica, 2 mirrored, 2 under central_storage, 1 with the whole step under XLA),
test_matrix.py the checks, each run on every workload on every shape: a SIGTERM resume
and a SIGKILL resume equal the uninterrupted run bit for bit, checkpoints and the evals
the resumed processes ran (every run evaluates every 10 steps, 3 eval batches with a
partial last); a resume that changes the fields a resume may change (batch size, loop
length, eval batch, learning rate) equals one process with that change (on 1 replica);
every shape agrees with 1 replica under plain SGD (the workload's measured
`agree_within`); step 20 of the run on 2 replicas resumed on 1 replica (elastic) ends where
1 replica's run ends, to that agreement, saying so in one line, or, for a workload whose
trajectory depends on the replica count (`refuses_elastic`), is refused in one line with
the model_dir untouched; one replica in a 2-device process is 1 replica bit for bit (the
summation order follows the config, not the devices); eval at the end = --mode=eval (on 1
and 2 replicas: test_matrix.EVAL_SHAPES) of
the saved step = the export scored on the eval data (1e-5); and a checkpoint of another
workload is refused (exit 2, one line, nothing moved). Each tolerance is what the cell
really achieves, so that the bugs of `python -m tests.mutations` fail a cell. conftest.py trains each (workload, shape) once per
session and shares it. A new way to lay out a run is one more `SHAPES` entry.
The harness and `python -m trainer.verify` are one mechanism: every run records its
variables' digests at each loop boundary as verify's runs do (conftest.ENV), the trainer
processes are verify's (trainer/verify/processes.py), and the resume cells (repeat,
SIGTERM, SIGKILL), the 2-replica cells and the elastic cells judge each workload with
verify's own judgments (trainer/verify/checks.py: the first step and variable that part,
against verify's bound), so what verify tells a user about their job is what the
catalogue proves on every workload.
The checks that read a run's files (SIGTERM and SIGKILL resumes, eval, export) also run
on storage gs:// and s3:// (conftest.STORAGES: the emulated buckets of
tests/support/object_stores.py), for conftest.BUCKET_WORKLOADS on 1 replica: the same run with
--model_dir=<a bucket>, its SIGKILL cutting a step's upload short, read back from the
bucket, equal to the run on local disk.

To add a workload (a new feature): add one file to workloads/ (copy cnn.py) whose
`WORKLOAD` is a `Workload` (workload.py) with
- `flags`: the command line a user would run (plug-ins from tests/plugins/, examples/
  or the file itself, for code only this workload uses; it
  should train with plain SGD, or give `sgd_flags` that make it so);
- `served(serve, replicas)`: the eval values scored from its export in numpy (None if it
  exports nothing that eval scores);
- `agree_within` where its shapes agree less closely than `AGREE_DEFAULT` (measure it:
  the cell's message gives the largest difference), `refuses_change` where a resume
  cannot make catalogue.CHANGES (the check then asserts the one-line refusal),
  `refuses_elastic` where its trajectory depends on the replica count (what the refusal
  names; shapes_agree is then n/a on 2 replicas: distloop refuses to mix them);
- `not_applicable` for a check that cannot hold by design (say why), and
  `known_defects` for a cell that fails on an open defect: it becomes xfail(strict), so
  the fix turns it into a failure until the entry is removed. Key either by check (every
  shape), by (check, shape), or (not_applicable) by (catalogue.EVERY_CHECK, shape).
Every check then runs on it. `python -m pytest -m slow tests/guarantees` runs the
matrix; the fast suite runs the cells in test_matrix.FAST.
"""
