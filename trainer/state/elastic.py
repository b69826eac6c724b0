"""A resume on another shape (replica count, workers, strategy) says what it is, in one
line, or is refused in one.

Each step's meta records the shape that trained it (`shape`). A resume compares it with
its own: the same replica count computes the same sums (bit for bit under
`runtime.deterministic`: 2 workers = 2 replicas in one process); another replica count
computes each step's sums in another order (float32 rounding, docs/guarantees.md) and
nothing else, as long as nothing the step computes for an example depends on which
replica holds it (Keras's random layers are drawn per example under
`runtime.deterministic`: trainer/task/randomness.py). What still depends on the replica
count (an unsynchronized BatchNormalization's statistics, randomness not drawn per
example: `dependence`) would put the resumed run on another trajectory: refused, unless
`checkpoint.allow_other_trajectory` asks for it. Pure Python.
"""
from trainer.errors import UserError

ALLOW_FLAG = "--config.checkpoint.allow_other_trajectory=true"


def shape(*, replicas: int, workers: int, strategy: str) -> dict:
  """What a step's meta records of the shape that trained it."""
  return {"replicas": int(replicas), "workers": int(workers), "strategy": str(strategy)}


def words(recorded: dict) -> str:
  """'2 replicas (2 workers, multi_worker_mirrored)'."""
  replicas = recorded.get("replicas")
  workers = recorded.get("workers", 1)
  where = f"{workers} workers, " if workers and workers > 1 else ""
  return f"{_replicas(replicas)} ({where}{recorded.get('strategy', '?')})"


def _replicas(count) -> str:
  return f"{count} replica{'s' if count != 1 else ''}"


def judge(recorded, now: dict, *, step: int, deterministic: bool, dependence: list[str],
          allowed: bool, strategy_dependence: list[str] = ()) -> str | None:
  """The line a resume of `step` (trained on `recorded`) on `now` logs, None if the shape
  is the same (or the step predates shapes); UserError if the trajectory would change
  and `allowed` is off. `dependence`: what makes this Task's trajectory depend on the
  replica count, in words (unsynchronized BatchNorm layers always; randomness not drawn
  per example only under `deterministic`, the only mode whose numbers are promised);
  `strategy_dependence`: what depends on the strategy even at the same replica count (a
  tf.random.Generator draws another stream under a distribution strategy, one_device
  included, than under the default one)."""
  if not isinstance(recorded, dict) or not isinstance(recorded.get("replicas"), int):
    return None
  if recorded == now:
    return None
  head = f"resuming step {step}, trained on {words(recorded)}, on {words(now)}"
  if (recorded["replicas"] == now["replicas"] and strategy_dependence
      and recorded.get("strategy") != now.get("strategy")):
    dependence, on = list(strategy_dependence), "the strategy"
    again = f"the {recorded.get('strategy')} strategy"
  elif recorded["replicas"] == now["replicas"]:
    same = ("bit for bit" if deterministic and "central_storage" not in
            (recorded.get("strategy"), now.get("strategy")) else "to float32 rounding")
    return f"{head}: the same replica count, the same trajectory ({same})"
  else:
    on = "the replica count"
    again = _replicas(recorded["replicas"])
  if dependence:
    what = "; ".join(dependence[:3]) + (f" and {len(dependence) - 3} more"
                                        if len(dependence) > 3 else "")
    if not allowed:
      raise UserError(
          f"{head} would change the trajectory: {what} depends on {on}; resume on "
          f"{again}, or pass {ALLOW_FLAG} to go on on another trajectory (nothing was "
          f"written)")
    return f"{head}: another trajectory, as checkpoint.allow_other_trajectory asks ({what})"
  if not deterministic:
    return (f"{head}: runtime.deterministic is off, so the trajectory is the same in "
            f"distribution, not number for number")
  return (f"{head}: the same trajectory to float32 rounding (each step's sums in another "
          f"order; docs/guarantees.md)")
