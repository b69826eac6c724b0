"""The table `python -m trainer.verify` prints, its JSON, and what usually causes a
difference, check by check."""
import json
import math

from trainer.verify.judging import REFUSED, Check

# What usually makes each check fail, in the order to look.
CAUSES = {
    "repeat": "two processes of the same job part before any interruption: a data order "
              "that depends on the process (an unseeded shuffle, the clock, os.getpid()), "
              "randomness outside step.normal/step.uniform (np.random, random, an unseeded "
              "op), or a non-deterministic kernel",
    "sigterm": "a resumed process parts from the uninterrupted one: state outside the "
               "checkpoint (a Python counter or attribute the step reads, a value kept "
               "outside the Task's variables), stateful randomness outside "
               "step.normal/step.uniform, or data read outside distloop's position",
    "sigkill": "a process resumed after SIGKILL parts from the uninterrupted one: state "
               "outside the checkpoint, randomness outside step.normal/step.uniform, or "
               "state the final eval reads that no checkpoint holds",
    "shapes": "another replica count parts by more than rounding: a reduction outside the "
              "StepContext (a loss or metric divided by the replica's batch, a mean over "
              "the replica's examples, a tf.distribute call of your own), or randomness "
              "drawn per replica",
    "elastic": "a resume on another replica count parts by more than rounding: a reduction "
               "outside the StepContext, or randomness drawn per replica",
    "workers": "workers part from as many replicas in one process: a reduction or a value "
               "of your own that depends on the worker (the task id, the host, a file "
               "only the chief reads), or data read outside distloop's position",
    "eval": "eval in a fresh process differs from training's: eval reads state no checkpoint "
            "holds, or eval_step draws randomness",
    "eval twice": "a process's eval of a step depends on the evals it ran before: a metric "
                  "the Task holds (a Keras Mean, a counter) that eval_step updates and never "
                  "resets, or other state eval_step writes; return per-example values and let "
                  "distloop take the means",
    "export": "the export of the checkpoint differs from training's: export() reads state no "
              "checkpoint holds",
}


def cause(check: Check) -> str:
  return CAUSES.get(check.name) or CAUSES[check.name.split()[0]]


def _number(value) -> str:
  if value is None:
    return "-"
  if value == 0:
    return "0"
  return "inf" if math.isinf(value) else f"{value:.1e}"


def _verdict(check: Check) -> str:
  if check.holds is None:
    return "n/a"
  if check.bound == REFUSED:
    return "refused"
  return "holds" if check.holds else "DIFFERS"


def table(checks: list[Check]) -> str:
  rows = [("check", "verdict", "bound", "largest", "tolerance", "what ran")]
  rows += [(c.name, _verdict(c), c.bound, _number(c.largest), _number(c.tolerance), c.note)
           for c in checks]
  widths = [max(len(row[i]) for row in rows) for i in range(5)]
  lines = ["  ".join(cell.ljust(width) for cell, width in zip(row[:5], widths)) + "  " + row[5]
           for row in rows]
  for check in checks:
    if check.holds is False:
      where = (f"step {check.first_step}, variable {check.first_variable}"
               if check.first_variable else f"step {check.first_step}")
      lines.append(f"{check.name}: first differs at {where} (by {_number(check.largest)}). "
                   f"Usually: {cause(check)}.")
  return "\n".join(lines)


def as_json(checks: list[Check], **about) -> str:
  def finite(value):
    return None if isinstance(value, float) and not math.isfinite(value) else value
  return json.dumps({
      "holds": all(c.holds is not False for c in checks), **about,
      "checks": [{"check": c.name, "verdict": _verdict(c), "bound": c.bound,
                  "largest": finite(c.largest), "tolerance": c.tolerance,
                  "first_step": c.first_step, "first_variable": c.first_variable,
                  "ran": c.note, **({"usually": cause(c)} if c.holds is False else {})}
                 for c in checks]}, indent=2)
