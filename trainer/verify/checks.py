"""The user's job run the ways a guarantee names, each judged against its bound.

Every run is a fresh `python -m trainer` process in its own scratch model_dir, with the
user's flags, then verify's own (`run_flags`: `--steps` steps (train.epochs unset) of one
step per loop, a
checkpoint every `interval`, every step kept, `runtime.deterministic=true`) and
DISTLOOP_DIGESTS=1 (trainer/loop/digests.py: each variable's digest at each step).

    reference   uninterrupted, on 1 replica
    chain       one model_dir, three processes: SIGTERM at a step (exit 42), resumed,
                SIGKILLed at a random moment (a seeded step, then a random delay),
                resumed to the end. Its steps up to the SIGTERM judge `repeat` (the same
                job, another process), those its second process kept `sigterm`, the rest
                `sigkill`: each bit for bit against the reference, step by step.
    sgd on N    for each replica count N of --shapes (1 included): the job under plain SGD
                (Adam is nearly blind to a gradient scaled by the replica count), N
                replicas of a MirroredStrategy in one process, each N against 1 to
                float32 rounding (`shapes N`).
    elastic     the SGD run on N as of its middle checkpoint, resumed on 1 replica: the
                1-replica trajectory to rounding, or refused in one line (what distloop
                does for a job whose steps depend on the replica count: `shapes N` is
                then the refusal).
                Where `shapes N` or `elastic` exceeds float32 rounding, the 1-replica SGD
                run once more in another summation order (oneDNN's kernels switched), and
                those two judged again against 10x what it parts by: the job's own
                rounding (one more sensitive to the order than most), the report saying so.
    eval        --mode=eval of the reference's last step in a fresh process = the eval
                the reference reported at its end, bit for bit.
    eval twice  the reference's last interval trained again by a process that evaluates
                every step (--mode=train_and_eval): its last eval = the reference's, bit
                for bit (a metric the Task never resets carries one eval into the next).
    export      --mode=export of that step in a fresh process = the export the reference
                wrote, every variable bit for bit.
    workers W   with --workers=W: the SGD job on W processes of one replica each
                (python -m trainer.launch) = W replicas in one process, bit for bit.

A difference is named by the first step and variable where it appears (the digests;
judging.py compares two runs), and what usually causes it (report.py). Two tracks of
processes run side by side (the reference's and the SGD runs'): a deterministic run's
numbers do not depend on the load.
"""
import concurrent.futures
import dataclasses
import json
import os
import random
import re
import shutil
import signal
import time
from typing import Callable

from trainer.loop import digests
from trainer.store import model_dir as layout
from trainer.verify import judging, processes
# What the guarantee harness and report.py read here (tests/guarantees/test_matrix.py).
from trainer.verify.judging import (  # noqa: F401
    BIT_FOR_BIT, OWN_ROUNDING, REFUSED, ROUNDING, ROUNDING_PER_STEP, Check, eval_difference,
    judge, judge_chain)

ONEDNN = "TF_ENABLE_ONEDNN_OPTS"
SGD = ("--config.train.optimizer=sgd", "--config.train.optimizer_args=")
EXIT_PREEMPTED = 42


@dataclasses.dataclass
class Job:
  """The user's job as verify runs it."""
  flags: tuple[str, ...]    # the user's --config and --config.FIELD=VALUE flags, as typed
  scratch: str              # a folder of its own: one model_dir per run
  steps: int = 12
  shapes: tuple[int, ...] = (1, 2)
  workers: int = 0          # > 1: also the job on this many workers (python -m trainer.launch)
  seed: int = 0             # chooses the SIGKILL's moment
  timeout: float = 600.0    # per process
  gpus: int = 0             # this machine's: a run of N replicas sees the first N
  log: Callable[[str], None] = print

  @property
  def interval(self) -> int:
    return max(2, self.steps // 4)

  def run_flags(self, replicas: int | None = None, *extra: str) -> list[str]:
    """The job's flags and verify's; `replicas`: that many in one process (mirrored, on as
    many logical CPU devices), None: the job's own strategy."""
    layout = (() if replicas is None else ("--config.runtime.strategy=mirrored",
                                           f"--config.runtime.num_cpu_devices={replicas}"))
    return [*self.flags, f"--config.train.steps={self.steps}", "--config.train.epochs=0",
            "--config.train.steps_per_loop=1", f"--config.checkpoint.interval={self.interval}",
            f"--config.checkpoint.max_to_keep={self.steps + 1}",
            "--config.checkpoint.interval_seconds=0", "--config.runtime.deterministic=true",
            *layout, *extra]

  def process(self, model_dir: str, flags: list[str], replicas: int | None = None,
              reordered: bool = False) -> processes.TrainerProcess:
    """A trainer process recording digests; `replicas`: of a run on that many replicas (on
    a GPU machine, MirroredStrategy takes every GPU it sees: it sees that many);
    `reordered`: oneDNN's kernels switched (off where this process has them on), so its
    sums run in another order."""
    env = {digests.ENV: "1"}
    if reordered:
      env[ONEDNN] = "1" if os.environ.get(ONEDNN, "") in ("0", "false", "False") else "0"
    if replicas is not None and self.gpus:
      env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(replicas))
    return processes.TrainerProcess(model_dir, *flags, env=env)


class JobFailed(Exception):
  """A run of the job did not train: its exit code and its last error line."""

  def __init__(self, what: str, code: int, output: str):
    self.what, self.code = what, code
    lines = [line for line in output.splitlines() if line.strip()]
    self.line = lines[-1] if lines else "(no output)"
    super().__init__(f"{what}: exit {code}: {self.line}")


def _finished(job: Job, process, what: str) -> str:
  code = process.finish(job.timeout)
  if code != 0:
    raise JobFailed(what, code, process.output)
  return process.output


def _run(job: Job, name: str, flags: list[str], replicas: int | None = None,
         reordered: bool = False) -> str:
  model_dir = os.path.join(job.scratch, name)
  job.log(f"verify: {name}")
  _finished(job, job.process(model_dir, flags, replicas, reordered), name)
  return model_dir


def copy_as_of(source: str, destination: str, step: int) -> None:
  """`source` as it was when `step` was its newest checkpoint: the later steps, the export,
  summary.json and finished.json left out (a resume there drops metrics.csv's rows past
  the step, and the digests' later records are recorded again). The guarantee harness
  copies its runs so too."""
  later = {str(kept) for kept in layout.checkpoint_steps(source) if kept > step}
  shutil.copytree(str(source), str(destination), dirs_exist_ok=True,
                  ignore=lambda directory, names: [
                      name for name in names
                      if (directory == layout.checkpoint_dir(str(source)) and name in later)
                      or (directory == str(source)
                          and name in ("export", "summary.json", "finished.json"))])


def _config(model_dir: str) -> dict:
  with open(os.path.join(model_dir, "config.json")) as f:
    return json.load(f)


def certify(job: Job) -> list[Check]:
  """Runs the job every way (module docstring) and returns the checks, in report order.
  JobFailed if a run does not do what it should (a refusal, a failure, a hang)."""
  os.makedirs(job.scratch, exist_ok=True)
  try:
    reference = _run(job, "reference", job.run_flags())
    sgd_flags = () if _config(reference)["train"]["optimizer"] == "sgd" else SGD
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
      chained = pool.submit(_chain_track, job, reference)
      shaped = pool.submit(_shapes_track, job, sgd_flags)
      return [*chained.result(), *shaped.result()]
  except processes.Failed as e:  # a process that ended or hung where a line was awaited
    lines = str(e).splitlines()
    raise JobFailed("", 1, lines[0] if lines else "") from None


# -- the reference's track: repeat, sigterm, sigkill, eval, export ----------------------

def _chain_track(job: Job, reference: str) -> list[Check]:
  checks = _chain(job, reference)
  return [*checks, _eval(job, reference), _eval_twice(job, reference), _export(job, reference)]


def _chain(job: Job, reference: str) -> list[Check]:
  chain = os.path.join(job.scratch, "chain")
  flags = job.run_flags()
  stop_at = max(1, job.steps // 4)
  job.log(f"verify: chain: SIGTERM at step {stop_at}")
  first = job.process(chain, flags)
  code = first.stop_at(rf"step {stop_at}/{job.steps}\b", timeout=job.timeout)
  if code != EXIT_PREEMPTED:
    raise JobFailed("chain (SIGTERM)", code, first.output)
  stopped = int(re.search(r"preempted at step (\d+)", first.output).group(1))

  # A step after the first checkpoint past the SIGTERM, then a moment within the next step
  # (as long as the reference's steps took): the kill lands mid-step, before the end.
  picker = random.Random(job.seed)
  kill_after = picker.randint(min(stopped + job.interval + 1, job.steps - 2), job.steps - 2)
  summary = judging.summary(reference)
  delay = picker.uniform(0.0, summary.get("train_time_sec", 0.0) / job.steps)
  job.log(f"verify: chain: resumed, SIGKILL {delay:.3f} s after step {kill_after}")
  second = job.process(chain, flags)
  try:
    second.wait_for(rf"step {kill_after}/{job.steps}\b", timeout=job.timeout)
    time.sleep(delay)
    second.send(signal.SIGKILL)
  except processes.Failed:
    pass  # ended first: its code says how
  code = second.finish(job.timeout)
  if code not in (0, -signal.SIGKILL):
    raise JobFailed("chain (resumed after SIGTERM)", code, second.output)

  job.log("verify: chain: resumed after the SIGKILL")
  third = _finished(job, job.process(chain, flags), "chain (resumed after SIGKILL)")
  restored = re.search(r"Restored checkpoint at step (\d+)", third)
  restored = int(restored.group(1)) if restored else job.steps
  return judge_chain(reference, chain, stopped=stopped, restored=restored,
                     last=job.steps, killed=f"after step {kill_after} (+{delay:.3f} s)")


def _eval(job: Job, reference: str) -> Check:
  check = Check("eval", BIT_FOR_BIT, tolerance=0.0,
                note=f"--mode=eval of step {job.steps} in a fresh process = the eval "
                     f"training reported at its end")
  summary = judging.summary(reference)
  if not summary.get("eval_examples"):
    check.note = "not applicable: the job evaluates nothing (no eval_step)"
    return check
  job.log("verify: eval")
  process = job.process(reference, [*job.run_flags(), "--mode=eval"])
  output = _finished(job, process, "--mode=eval")
  evaluated = json.loads([line for line in output.splitlines() if line.startswith("{")][-1])
  worst, first = eval_difference(
      summary, {f"eval_{key}": value for key, value in evaluated.items()})
  check.holds, check.largest = first is None, worst
  if first:
    check.first_step, check.first_variable = job.steps, first
  return check


def _eval_twice(job: Job, reference: str) -> Check:
  """The last interval of the reference trained again in a process that evaluates every
  step (--mode=train_and_eval): its eval of the last step comes after others in that
  process, and must be the reference's, the only one its process ran. A metric the Task
  holds and never resets (a Keras Mean updated by eval_step) carries the earlier evals
  into the last; every other check runs one eval per process, and a checkpoint holds the
  metric as it was, so only a second eval in one process shows it."""
  start = job.steps - job.interval
  check = Check("eval twice", BIT_FOR_BIT, tolerance=0.0,
                note=f"step {start} resumed with an eval at each step: its eval of step "
                     f"{job.steps} = the reference's")
  if not judging.summary(reference).get("eval_examples"):
    check.note = "not applicable: the job evaluates nothing (no eval_step)"
    return check
  again = os.path.join(job.scratch, "eval-twice")
  copy_as_of(reference, again, start)
  job.log("verify: eval twice")
  _finished(job, job.process(again, [*job.run_flags(), "--mode=train_and_eval",
                                     "--config.eval.interval=1"]), "eval twice")
  worst, first = eval_difference(judging.summary(reference), judging.summary(again))
  check.holds, check.largest = first is None, worst
  if first:
    check.first_step, check.first_variable = job.steps, first
  return check


def _export(job: Job, reference: str) -> Check:
  check = Check("export", BIT_FOR_BIT, tolerance=0.0,
                note=f"--mode=export of step {job.steps} in a fresh process = the export "
                     f"training wrote")
  written = os.path.join(reference, "export", str(job.steps))
  if not os.path.isdir(written):
    check.note = "not applicable: the job exports nothing"
    return check
  again = os.path.join(job.scratch, "export")
  copy_as_of(reference, again, job.steps)
  job.log("verify: export")
  _finished(job, job.process(again, [*job.run_flags(), "--mode=export"]), "--mode=export")
  worst, first = judging.export_difference(written,
                                           os.path.join(again, "export", str(job.steps)))
  check.holds, check.largest = first is None, worst
  if first:
    check.first_step, check.first_variable = job.steps, first
  return check


# -- the SGD track: shapes and elastic ---------------------------------------------------

def _shapes_track(job: Job, sgd_flags: tuple) -> list[Check]:
  counts = sorted(set(job.shapes if len(job.shapes) > 1 else ()) | (
      {job.workers} if job.workers > 1 else set()))
  runs = {n: _run(job, f"sgd-{n}", job.run_flags(n, *sgd_flags), n) for n in counts}
  one = digests.read(runs[1]) if 1 in runs else {}
  checks, judged = [], []  # judged: (check, the other run's digests, its steps)
  for n in job.shapes[1:]:
    elastic = _elastic(job, runs[n], runs[1], n, sgd_flags, judged)
    shape = Check(f"shapes {n}", ROUNDING, tolerance=ROUNDING_PER_STEP * job.steps,
                  note=f"{n} replicas against 1, plain SGD, steps 1-{job.steps} (bound "
                       f"{ROUNDING_PER_STEP:.0e} per step)")
    if elastic.bound == REFUSED:
      shape.bound = REFUSED
      shape.note = ("not judged: the job's steps depend on the replica count, so distloop "
                    "refuses to resume it on another (elastic)")
    else:
      other = digests.read(runs[n])
      judging.judge_digests(shape, one, other, range(1, job.steps + 1),
                            lambda step: ROUNDING_PER_STEP * step)
      judged.append((shape, other, range(1, job.steps + 1)))
    checks += [shape, elastic]
  if any(check.holds is False for check, _, _ in judged):
    reordered = _run(job, "sgd-1-reordered", job.run_flags(1, *sgd_flags), 1, reordered=True)
    own = judging.own_rounding(one, digests.read(reordered))
    for check, other, steps in judged:
      if check.holds is False:
        judging.judge_own_rounding(check, one, other, steps, own)
  if job.workers > 1:
    checks.append(_workers(job, runs[job.workers], sgd_flags))
  return checks


def _workers(job: Job, one_process: str, sgd_flags: tuple) -> Check:
  """The job on `job.workers` processes of one replica each (python -m trainer.launch,
  multi_worker_mirrored) against as many replicas in one process: the same sums in the
  same order, so bit for bit (docs/guarantees.md)."""
  n = job.workers
  check = Check(f"workers {n}", BIT_FOR_BIT, tolerance=0.0,
                note=f"{n} workers of 1 replica (python -m trainer.launch) against {n} "
                     f"replicas in one process, plain SGD, steps 1-{job.steps}")
  model_dir = os.path.join(job.scratch, f"workers-{n}")
  flags = [*(flag for flag in job.run_flags(None, *sgd_flags)
             if not flag.startswith(("--config.runtime.strategy=",
                                     "--config.runtime.num_cpu_devices="))),
           "--config.runtime.strategy=multi_worker_mirrored", "--config.runtime.num_cpu_devices=1"]
  job.log(f"verify: workers {n}")
  launched = processes.TrainerProcess(None, f"--num_workers={n}", "--max_restarts=0", "--",
                                      f"--model_dir={model_dir}", *flags,
                                      module="trainer.launch", env={digests.ENV: "1"})
  _finished(job, launched, f"{n} workers")
  judging.judge_digests(check, digests.read(one_process), digests.read(model_dir),
                        range(1, job.steps + 1), 0.0)
  if check.holds:
    worst, first = judging.final_difference(one_process, model_dir, job.steps)
    if first:
      check.holds, check.largest = False, worst
      check.first_step, check.first_variable = job.steps, first
  return check


def _elastic(job: Job, run: str, one: str, n: int, sgd_flags: tuple, judged: list) -> Check:
  middle = (job.steps // 2) // job.interval * job.interval or job.interval
  check = Check(f"elastic {n}->1", ROUNDING, tolerance=ROUNDING_PER_STEP * job.steps,
                note=f"step {middle} of {n} replicas resumed on 1: steps {middle + 1}-"
                     f"{job.steps} against 1 replica's")
  resumed = os.path.join(job.scratch, f"elastic-{n}")
  copy_as_of(run, resumed, middle)
  job.log(f"verify: elastic {n}->1")
  process = job.process(resumed, job.run_flags(1, *sgd_flags), 1)
  code = process.finish(job.timeout)
  if code == 2:
    check.bound, check.holds = REFUSED, True
    check.note = "refused: " + JobFailed("", code, process.output).line
    return check
  if code != 0:
    raise JobFailed(f"elastic {n}->1", code, process.output)
  other, steps = digests.read(resumed), range(middle + 1, job.steps + 1)
  judging.judge_digests(check, digests.read(one), other, steps,
                        lambda step: ROUNDING_PER_STEP * step)
  judged.append((check, other, steps))
  return check


