"""Every workload of the catalogue against every guarantee, on every shape (conftest.SHAPES:
1 replica, 2 mirrored, 2 central_storage, 1 under whole-step XLA).
Tolerances are what each cell really achieves (a resume: bit for bit; a shape: the
workload's measured `agree_within`), so a change of summation order fails a cell.

A cell is (check, workload, shape), and for the checks that read a run's files
(conftest.BUCKET_CHECKS: the resumes, eval, export) also its storage: local disk, or
the same run on a gs:// or s3:// bucket (conftest.STORAGES; BUCKET_WORKLOADS on
BUCKET_SHAPES), which must equal the run on local disk. The fast suite runs `FAST`:
the built-in CNN's eval = --mode=eval = export on 1 replica and one refusal (a few
trainer processes, ~30 s); `python -m pytest -m slow tests/guarantees` runs the rest.
"""
import json
import os
import shutil

import numpy as np
import pytest

from trainer.verify import checks as verify
from trainer.verify import report
from tests.guarantees import catalogue
from tests.guarantees.conftest import (SAMPLED_OUT, sampled_out)
from tests.guarantees.conftest import (BUCKET_CHECKS, BUCKET_FLAGS, BUCKET_SHAPES,
                                       BUCKET_WORKLOADS, ORDER_SHAPES, SHAPES, STORAGES, arrays,
                                       complete_steps, digests, eval_rows, flags, trainer_run,
                                       tracker_calls, train_rows)

FAST = {("eval", "cnn", "1"), ("export", "cnn", "1"), ("refused", "softmax_head", "1")}
# A resume is bit for bit: the same kernels, threads and batches in the same order
# (measured 0.0 on every workload and shape; anything else is a lost or altered state).
RESUME_TOLERANCE = 0.0
EVAL_TOLERANCE = 1e-5


def cells(check: str, shapes=tuple(SHAPES), applies=lambda workload: True):
  """pytest params (workload name, shape) of `check`: slow unless in FAST, skipped
  where the check does not apply, xfail (strict) on a known defect. A check of
  BUCKET_CHECKS: (workload name, shape, storage), local disk's ids as they were, a
  bucket's "<workload>-<shape>-<gs|s3>" (slow)."""
  params = []
  for workload in catalogue.CATALOGUE:
    for shape, storage in [(shape, "local") for shape in shapes] + [
        (shape, storage) for storage in STORAGES[1:] for shape in BUCKET_SHAPES
        if check in BUCKET_CHECKS and workload.name in BUCKET_WORKLOADS and shape in shapes]:
      on_disk = storage == "local"
      marks = [] if on_disk and (check, workload.name, shape) in FAST else [pytest.mark.slow]
      why_not = workload.why_not(check, shape) or (
          SAMPLED_OUT if sampled_out(check, workload.name, shape) else None)
      if why_not or not applies(workload):
        marks.append(pytest.mark.skip(reason=why_not or f"{workload.name} exports nothing "
                                                         "to score"))
      defect = workload.defect(check, shape)
      if defect:
        marks.append(pytest.mark.xfail(strict=True, reason=defect))
      values = (workload.name, shape, storage) if check in BUCKET_CHECKS else (workload.name, shape)
      params.append(pytest.param(*values, marks=marks, id=f"{workload.name}-{shape}" + (
          "" if on_disk else f"-{storage}")))
  return params


def assert_same(actual: dict, expected: dict, atol: float, what: str):
  assert actual.keys() == expected.keys(), (what, sorted(actual), sorted(expected))
  worst = max(np.abs(np.asarray(actual[key], np.float64) - expected[key]).max(initial=0)
              for key in expected)
  for key in expected:
    np.testing.assert_allclose(actual[key], expected[key], atol=atol, rtol=0,
                               err_msg=f"{what}: {key} (largest difference {worst:.3g})")


@pytest.mark.parametrize("name, shape, storage", cells("sigterm"))
def test_sigterm_resume_equals_uninterrupted(runs, store, name, shape, storage):
  """SIGTERM at step 5 -> a checkpoint of the stop step, exit 42; the resumed process's
  next checkpoints equal the uninterrupted run's, model, optimizer and Task state, and so
  do the evals it ran (steps 10-30): they read the live state (EMA weights, BatchNorm
  statistics, a Task's variables), so a variable the checkpoint left out fails here
  even when the checkpoints cannot show it. On a bucket, against the run on local disk:
  metrics.csv not staged from the bucket on resume (the evals the earlier processes
  logged lost) fails here."""
  reference, _ = runs.uninterrupted(name, shape)
  run = runs.interrupted(name, shape, store)
  assert run.stopped_at < run.restored < run.killed_after, run  # written after the resume
  assert_verified(reference, run, "sigterm")
  assert_same(arrays(run.model_dir, run.restored), arrays(reference, run.restored),
              RESUME_TOLERANCE, f"step {run.restored} after a SIGTERM at {run.stopped_at}")
  if not catalogue.BY_NAME[name].evaluates:
    return
  expected = {key: value for key, value in eval_rows(reference).items()
              if run.stopped_at < key[0] <= run.restored}
  assert expected, f"no eval logged between steps {run.stopped_at} and {run.restored}"
  evaluated = {key: value for key, value in eval_rows(run.model_dir).items() if key in expected}
  assert_same(evaluated, expected, RESUME_TOLERANCE,
              f"the evals after a SIGTERM at {run.stopped_at} (metrics.csv)")


@pytest.mark.parametrize("name, shape, storage", cells("sigkill"))
def test_sigkill_resume_equals_uninterrupted(runs, store, name, shape, storage):
  """SIGKILL at step 35 loses the steps since the last complete checkpoint; the run that
  resumes from it ends with the uninterrupted run's state, and reports its eval values
  (which see state a checkpoint comparison cannot: EMA weights, a Task's variables).
  On a bucket the kill cuts the upload of step 30 short (conftest.Runs.interrupted), and
  the end equals the run on local disk: a step that counts before all its files are in
  the bucket (orbax's own commit_success.txt uploaded among them, or distloop's marker
  first), or one staged without its marker (then set aside), fails here
  (tests/mutations: bucket_*)."""
  reference, expected = runs.uninterrupted(name, shape)
  run = runs.interrupted(name, shape, store)
  assert run.restored % 10 == 0 and run.restored < run.killed_after, run
  assert_verified(reference, run, "sigkill")
  assert_same(arrays(run.model_dir, catalogue.STEPS), arrays(reference, catalogue.STEPS),
              RESUME_TOLERANCE, f"the end, after a SIGKILL at step {run.killed_after}")
  with open(os.path.join(str(run.model_dir), "summary.json")) as f:
    summary = json.load(f)
  assert_same({key: summary.get(key, np.nan) for key in _eval_values(expected)},
              {key: expected[key] for key in _eval_values(expected)}, RESUME_TOLERANCE,
              f"the final eval after a SIGKILL at step {run.killed_after} (summary.json)")
  assert_each_step_reached_the_tracker_once(run)


def assert_each_step_reached_the_tracker_once(run) -> None:
  """The interrupted run's user tracker (conftest.TRACKER_FLAGS), which cannot delete a
  step, got each step metrics.csv holds exactly once, across the SIGTERM, the SIGKILL and
  both resumes, with metrics.csv's train values (steps past the restored one were handed
  to it by the killed process: the values trained again are the same). Catches: a
  step handed twice after a resume (tests/mutations: tracker_handed_a_step_twice), on a
  bucket reporters.json not staged back."""
  with open(tracker_calls(run.model_dir)) as f:
    calls = [json.loads(line) for line in f]
  handed = [(call[1], call[2]) for call in calls if call[0] == "write"]
  assert len(handed) == len(set(handed)), f"handed twice: {sorted(handed)}"
  timing = ("examples_per_sec", "steps_per_sec")  # the clock's, not the trajectory's
  logged = {key: value for key, value in train_rows(run.model_dir).items()
            if key[1] not in timing}
  got = {(step, name): value for _, step, split, values in
         (call for call in calls if call[0] == "write") if split == "train"
         for name, value in values.items() if name not in timing}
  assert {step for step, split in handed if split == "train"} == {step for step, _ in logged}
  assert_same(got, logged, RESUME_TOLERANCE, "the train values the tracker got, against "
              "metrics.csv")


def assert_verified(reference, run, name: str) -> None:
  """`python -m trainer.verify`'s judgment of the resume `name` (repeat, sigterm, sigkill)
  on the workload's runs, from the digests every run of the matrix records at each loop
  boundary (conftest.ENV): the product's own check, on every workload; a difference
  names its first step and variable. A bucket's runs record none (judged by the rest)."""
  if run.url is not None:
    return
  judged = {check.name: check for check in verify.judge_chain(
      str(reference), str(run.model_dir), stopped=run.stopped_at, restored=run.restored,
      last=catalogue.STEPS, killed=f"at step {run.killed_after}")}
  for check in ([judged["repeat"], judged["sigterm"]] if name == "sigterm"
                else [judged["sigkill"]]):
    assert check.holds, report.table([check])


def _eval_values(summary: dict) -> list[str]:
  return [key for key in summary if key.startswith("eval_") and not key.endswith("_sec")]


@pytest.mark.parametrize("name, shape", cells("shapes_agree", shapes=tuple(SHAPES)[1:]))
def test_every_shape_trains_the_weights_of_one_replica(runs, name, shape):
  """Plain SGD moves the weights in proportion to the gradient: a reduction missing or
  counted twice on 2 replicas (mirrored or central storage), or a step XLA compiles
  differently, fails by far more than the tolerance."""
  one = arrays(runs.sgd(name, "1"), catalogue.STEPS)
  other = arrays(runs.sgd(name, shape), catalogue.STEPS)
  start = arrays(runs.sgd(name, "1"), 10)
  moved = max(np.abs(one[key] - start[key]).max() for key in one if key.startswith("model/"))
  assert moved > 1e-3, f"the weights hardly moved from step 10 ({moved:.2g}): nothing to compare"
  workload = catalogue.BY_NAME[name]
  assert_same(other, one, workload.agreement(shape), f"shape {shape} against 1 replica")
  if shape == VERIFY_SHAPE:
    assert_verified_rounding(runs.sgd(name, "1"), runs.sgd(name, shape), range(1, catalogue.STEPS + 1),
                             f"shapes {SHAPES[shape].replicas}")


# The shape `python -m trainer.verify` compares with 1 replica: 2 replicas of a
# MirroredStrategy in one process.
VERIFY_SHAPE = "2"


def assert_verified_rounding(one, other, steps, name: str) -> None:
  """`python -m trainer.verify`'s bound on another replica count (float32 rounding: a few
  ulps a step, carried along) holds at every loop boundary of the workload's runs: verify
  reports no difference on any workload of the catalogue (a bound too tight for a model
  kind would be a false alarm on a user's job; one too loose, tests/verify's)."""
  check = verify.Check(name, verify.ROUNDING, tolerance=verify.ROUNDING_PER_STEP * max(steps))
  verify.judge(check, str(one), str(other), steps, lambda step: verify.ROUNDING_PER_STEP * step)
  assert check.holds, report.table([check])


@pytest.mark.parametrize("name, shape", cells("order", shapes=tuple(ORDER_SHAPES)))
def test_the_summation_order_does_not_follow_the_devices(runs, name, shape):
  """One replica in a process of 2 logical devices trains the weights of "1" bit for bit:
  the threads per op (hence every sum's order) are the config's, not the device count's.
  The 2-replica shapes cannot show this: their own rounding is as large as the change."""
  one = arrays(runs.sgd(name, "1"), catalogue.STEPS)
  assert_same(arrays(runs.sgd(name, shape), catalogue.STEPS), one, 0.0,
              f"shape {shape} against 1 replica")


@pytest.mark.parametrize("name, shape", cells("resume_changed", shapes=("1",)))
def test_resume_with_changed_fields_equals_the_run_with_that_change(runs, name, shape):
  """20 steps, then every kind of field a resume may change (the batch size, the loop
  length, the eval batch, the learning rate: catalogue.CHANGES): SIGTERMed after the
  change and resumed, the run ends where one process with the same change ends: the
  data position is counted in examples, not in steps of today's batch. A workload that
  cannot make the change refuses it in one line, exit 2, nothing written."""
  run = runs.changed(name, shape)
  if run.refusal is not None:
    assert run.refusal.returncode == 2, f"exit {run.refusal.returncode}\n{run.refusal.stderr[-3000:]}"
    assert len(run.refusal.error_lines()) == 1, run.refusal.stderr[-3000:]
    return
  assert catalogue.CHANGED_AT < run.stopped_at < catalogue.STEPS, run
  assert_same(arrays(run.resumed, catalogue.STEPS), arrays(run.reference, catalogue.STEPS),
              RESUME_TOLERANCE, f"the end, after a change at {catalogue.CHANGED_AT} and a "
                                f"SIGTERM at {run.stopped_at}")
  if not catalogue.BY_NAME[name].evaluates:
    return
  expected = {key: value for key, value in eval_rows(run.reference).items()
              if key[0] > run.stopped_at}
  assert expected, eval_rows(run.reference)
  assert_same({key: eval_rows(run.resumed).get(key, np.nan) for key in expected}, expected,
              RESUME_TOLERANCE, "the evals after the resume (metrics.csv)")


@pytest.mark.parametrize("name, shape", cells("elastic", shapes=("2",)))
def test_a_resume_on_another_replica_count_keeps_the_trajectory_or_is_refused(runs, name, shape):
  """Step 20 of the run on 2 replicas, resumed on 1 replica: each step's sums in another order
  and nothing else (Keras's random layers drawn per example, synchronized BatchNorm), so it
  ends where 1 replica's run ends, to the workload's rounding on 2 replicas, and says what it
  is in one line. A workload whose trajectory depends on the replica count
  (`refuses_elastic`: unsynchronized BatchNorm, a tf.random.Generator) is refused instead:
  exit 2, one line naming why, no traceback, nothing in the model_dir changed."""
  workload = catalogue.BY_NAME[name]
  run = runs.elastic(name, shape)
  result = run.result
  said = f"resuming step {catalogue.ELASTIC_AT}, trained on {SHAPES[shape].replicas} replicas"
  lines = [line for line in result.stderr.splitlines() if said in line]
  if workload.refuses_elastic:
    assert result.returncode == 2, f"exit {result.returncode}\n{result.stderr[-3000:]}"
    assert result.error_lines() == lines, result.stderr[-3000:]  # that line, nothing else
    assert len(lines) == 1 and workload.refuses_elastic in lines[0], (workload.refuses_elastic,
                                                                      lines)
    assert digests(run.model_dir) == run.before, "the refused resume changed the model_dir"
    return
  assert result.returncode == 0, f"exit {result.returncode}\n{result.stderr[-4000:]}"
  assert len(lines) == 1, f"{len(lines)} lines say {said!r}\n{result.stderr[-3000:]}"
  assert "the same trajectory to float32 rounding" in lines[0], lines[0]
  assert f"Restored checkpoint at step {catalogue.ELASTIC_AT}" in result.stderr
  assert_same(arrays(run.model_dir, catalogue.STEPS), arrays(runs.sgd(name, "1"), catalogue.STEPS),
              workload.agreement(shape), f"step {catalogue.ELASTIC_AT} of shape {shape} resumed "
                                         f"on 1 replica, against 1 replica")
  assert_verified_rounding(runs.sgd(name, "1"), run.model_dir,
                           range(catalogue.ELASTIC_AT + 1, catalogue.STEPS + 1),
                           f"elastic {SHAPES[shape].replicas}->1")


def _finished(runs, store, name: str, shape: str):
  """(model_dir, summary.json, where --mode=eval reads it, its env) of the run the eval and
  export checks read: on local disk the uninterrupted run; on a bucket the interrupted
  run's (its last process evaluated and exported at the end), downloaded, whose
  summary must be the local uninterrupted run's: the same values, bit for bit."""
  model_dir, summary = runs.uninterrupted(name, shape)
  if store is None:
    return model_dir, summary, model_dir, None
  run = runs.interrupted(name, shape, store)
  with open(os.path.join(str(run.model_dir), "summary.json")) as f:
    on_bucket = json.load(f)
  assert on_bucket["step"] == catalogue.STEPS, on_bucket
  assert_same({key: on_bucket.get(key, np.nan) for key in _eval_values(summary)},
              {key: summary[key] for key in _eval_values(summary)}, RESUME_TOLERANCE,
              f"summary.json on {store.scheme}:// against local disk")
  return run.model_dir, on_bucket, run.url, store.env


# --mode=eval's own path (a fresh process that restores the newest step and evaluates the
# whole split) differs with the replica count only: how the last, partial batch is split.
# A restore's evals on central storage and under XLA are the sigterm check's (the evals a
# resumed process runs equal the uninterrupted run's, bit for bit, on every shape), which
# asks more of them than this check's 1e-5; a process each of these cells was 25 of 61.
EVAL_SHAPES = ("1", "2")


@pytest.mark.parametrize("name, shape, storage", cells("eval", shapes=EVAL_SHAPES))
def test_eval_equals_mode_eval(runs, store, name, shape, storage):
  """What training reported at its end (summary.json) is what --mode=eval of the saved
  step reports: every value, to 1e-5, on 1 and 2 replicas (EVAL_SHAPES). On a bucket,
  --mode=eval reads the bucket (--model_dir=gs://... or s3://...) and summary.json is the
  bucket's: summary.json not put in the bucket at the end fails here."""
  _, summary, where, env = _finished(runs, store, name, shape)
  extra = BUCKET_FLAGS if store is not None else ()
  result = trainer_run(where, *flags(catalogue.BY_NAME[name], shape, *extra), "--mode=eval",
                       env=env)
  assert result.returncode == 0, f"exit {result.returncode}\n{result.stderr[-3000:]}"
  evaluated = json.loads(result.stdout.strip().splitlines()[-1])
  assert evaluated["step"] == catalogue.STEPS
  # eval batches of 96 and a partial last: each example counted once, the last included
  examples = catalogue.BY_NAME[name].eval_examples
  assert examples % catalogue.EVAL_BATCH, "the matrix's eval should end with a partial batch"
  assert summary["eval_examples"] == examples, summary
  assert evaluated["examples"] == examples, evaluated
  reported = {key.removeprefix("eval_"): summary[key] for key in _eval_values(summary)}
  assert reported and reported.keys() <= evaluated.keys(), (reported, evaluated)
  for key, value in reported.items():
    assert evaluated[key] == pytest.approx(value, abs=EVAL_TOLERANCE), (key, evaluated, summary)
  # python -m trainer.verify's eval check: on the shape that trained, bit for bit
  worst, first = verify.eval_difference(summary, {f"eval_{key}": value
                                                  for key, value in evaluated.items()})
  assert first is None, f"verify's eval check: {first} differs by {worst:.2g}"


@pytest.mark.parametrize("name, shape, storage",
                         cells("export", applies=lambda workload: workload.served is not None))
def test_export_equals_eval(runs, store, name, shape, storage):
  """The SavedModel of the final step, scored on the eval data in numpy, gives what
  eval reported (summary.json), to 1e-5. On a bucket, the export as the bucket holds it:
  an upload of saved_model.pb without its variables/ fails here."""
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  model_dir, summary, _, _ = _finished(runs, store, name, shape)
  export_dir = os.path.join(str(model_dir), "export", str(catalogue.STEPS))
  serve = tf.saved_model.load(export_dir).signatures["serving_default"]
  scored = catalogue.BY_NAME[name].served(serve, SHAPES[shape].replicas)
  for key, value in scored.items():
    assert value == pytest.approx(summary[key], abs=EVAL_TOLERANCE), (key, scored, summary)


# Batches of 99, chunks of 150: chunks end mid-batch, the last batch is partial (256 rows:
# 58; 1000: 10), and on 2 replicas a batch's slices are 50 and 49 rows, the second
# topped up with a row of the next batch that the host drops.
PREDICT_FLAGS = ("--mode=predict", "--config.predict.global_batch_size=99",
                 "--config.predict.chunk_rows=150")


@pytest.mark.parametrize("name, shape", cells("predict", shapes=("2",)))
def test_predict_writes_each_row_once_the_same_bytes_on_every_shape(runs, tmp_path, name,
                                                                    shape):
  """--mode=predict of the final step of 1 replica's run, on 1 replica and on `shape`: each
  eval row once, in order (the index column), the Parquet and records bytes the same on
  both (a row's values depend on its example alone: a replica's slice of another length,
  a draw per replica, rows gathered out of order all fail here), and each row the
  export's on that example, to 1e-5 (the EMA weights, an output transform, a column
  dropped). A Task with neither predict_step nor export() is refused in one line, exit 2,
  nothing written."""
  import pyarrow.parquet as pq  # pylint: disable=import-outside-toplevel
  workload = catalogue.BY_NAME[name]
  model_dir, _ = runs.uninterrupted(name, "1")
  written = {}
  for on in ("1", shape):
    output = tmp_path / on
    result = trainer_run(model_dir, *flags(workload, on), *PREDICT_FLAGS,
                         f"--config.predict.output={output}")
    if workload.predicts is None:
      assert result.returncode == 2, f"exit {result.returncode}\n{result.stderr[-3000:]}"
      assert len(result.error_lines()) == 1 and "predict_step" in result.stderr, result.stderr[-3000:]
      assert not output.exists()
      return
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stderr[-3000:]}"
    written[on] = {str(path.relative_to(output)): path.read_bytes()
                   for path in sorted(output.rglob("*")) if path.is_file()}  # manifests too
  assert written[shape] == written["1"], sorted(
      key for key in written["1"] if written["1"][key] != written[shape].get(key))
  table = pq.read_table(tmp_path / "1" / "parquet").to_pydict()
  assert table["index"] == list(range(workload.eval_examples))
  if workload.predicts == "export":
    expected = _export_rows(model_dir, workload)
    assert expected, "the workload's scorer served nothing"
    for column, rows in expected.items():
      np.testing.assert_allclose(np.asarray(table[column], np.float64).reshape(rows.shape),
                                 rows, atol=EVAL_TOLERANCE, rtol=0, err_msg=column)


def _export_rows(model_dir, workload) -> dict:
  """The export's outputs on the eval examples in order: the workload's scorer, recorded."""
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  serve = tf.saved_model.load(os.path.join(str(model_dir), "export", str(catalogue.STEPS))
                              ).signatures["serving_default"]
  calls = []

  def recorded(**inputs):
    outputs = serve(**inputs)
    calls.append({key: value.numpy() for key, value in outputs.items()})
    return outputs
  workload.served(recorded, 1)
  return {key: np.concatenate([call[key] for call in calls]) for key in calls[0]} if calls else {}


@pytest.mark.parametrize("name, shape", cells("refused", shapes=("1",)))
def test_checkpoint_of_another_workload_is_refused(runs, tmp_path, name, shape):
  """A step of another workload (other variables and shapes) copied into checkpoints/:
  exit 2, one line, and the step is neither restored nor moved. On 1 replica: the verdict
  reads the step's recorded identity (fixed fields, Task, the saved keys and shapes),
  which no replica count changes (trainer/state/config_changes.py: check_step)."""
  workload = catalogue.BY_NAME[name]
  donor, _ = runs.uninterrupted(workload.donor, "1")
  copied = tmp_path / "checkpoints" / str(catalogue.STEPS)
  shutil.copytree(os.path.join(str(donor), "checkpoints", str(catalogue.STEPS)), copied)
  before = sorted(os.listdir(copied))
  result = trainer_run(tmp_path, *flags(workload, shape))
  assert result.returncode == 2, f"exit {result.returncode}\n{result.stderr[-3000:]}"
  assert len(result.error_lines()) == 1, result.stderr[-3000:]
  assert "Restored checkpoint" not in result.stderr
  assert complete_steps(tmp_path) == [catalogue.STEPS] and sorted(os.listdir(copied)) == before
