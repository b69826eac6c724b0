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
`checkpoint.allow_other_trajectory` asks for it. Pure Python: a refusal is decided from
the JSON on disk before TensorFlow starts where the shape to come is known without it
(`refuse_before_start`), else after the restore.
"""
import glob
import os

from trainer.errors import UserError
from trainer.store import model_dir as layout

ALLOW_FLAG = "--config.checkpoint.allow_other_trajectory=true"


def shape(*, replicas: int, workers: int, strategy: str) -> dict:
  """What a step's meta records of the shape that trained it."""
  return {"replicas": int(replicas), "workers": int(workers), "strategy": str(strategy)}


def dependence(*, deterministic: bool, replicas: list[str], strategy: list[str]) -> dict:
  """What a step's meta records of what makes its trajectory depend on the shape (judge's
  `dependence` and `strategy_dependence`, found by tracing the step): a resume reads it
  back before TensorFlow starts (`refuse_before_start`)."""
  return {"deterministic": bool(deterministic), "replicas": list(replicas),
          "strategy": list(strategy)}


def refuse_before_start(model_dir: str, config) -> None:
  """The refusal `judge` makes once the step is restored, made before TensorFlow starts
  (the data, the runtime, the model and its trace: seconds) from the JSON on disk: the
  newest step's meta (its shape, what made its trajectory depend on it) and the shape
  this process will have, where the config alone says it (`_shape_before_start`). It
  runs before the config's checks, whose plug-in imports (a model's module importing
  Keras) start TensorFlow, so it reads only fields whose values it checks itself.
  Anything else is judged after the restore, as before: a GPU, a cluster, a step saved
  before meta recorded its dependence, another runtime.deterministic, a finished run (a
  rerun is "already finished"), train.epochs (the steps are known after the data), a
  field the config's checks will refuse. Only the refusal is decided here; the line of
  a resume that goes on comes with the restore."""
  try:
    runtime, allowed = config.runtime, config.checkpoint.allow_other_trajectory
    steps = None if config.train.epochs else config.train.steps
    deterministic = runtime.deterministic
  except (AttributeError, KeyError):
    return  # a field missing: the config's checks name it
  if (not isinstance(deterministic, bool) or not isinstance(allowed, bool)
      or not isinstance(steps, int) or isinstance(steps, bool)
      or layout.finished_step(model_dir, steps, config.to_dict()) is not None):
    return
  now = _shape_before_start(runtime)
  if now is None:
    return
  for step, meta in layout.steps_with_meta(model_dir):
    if meta is None:
      continue  # unreadable: the restore sets it aside and judges the step it takes
    recorded = meta.get("dependence")
    if isinstance(recorded, dict) and recorded.get("deterministic") == deterministic:
      replicas, strategy = recorded.get("replicas"), recorded.get("strategy")
      if _words_list(replicas) and _words_list(strategy):
        judge(meta.get("shape"), now, step=step, deterministic=deterministic,
              dependence=replicas, allowed=allowed, strategy_dependence=strategy)
    return


def _words_list(value) -> bool:
  return isinstance(value, list) and all(isinstance(item, str) for item in value)


def _shape_before_start(runtime) -> dict | None:
  """The shape a single process of a local strategy will have on CPUs (runtime.strategy
  and runtime.num_cpu_devices say it); None where only TensorFlow can tell (a GPU's
  device files are there) or a cluster may be involved (TF_CONFIG, Slurm)."""
  try:
    strategy, replicas = runtime.strategy, runtime.num_cpu_devices
  except (AttributeError, KeyError):
    return None
  if strategy not in ("default", "one_device", "mirrored", "central_storage"):
    return None
  if os.environ.get("TF_CONFIG") or "SLURM_PROCID" in os.environ:
    return None
  if glob.glob("/dev/nvidia[0-9]*") or os.path.exists("/dev/kfd"):  # NVIDIA's, ROCm's
    return None
  if strategy in ("default", "one_device"):
    replicas = 1
  if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 1:
    return None
  return shape(replicas=replicas, workers=1, strategy=strategy)


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
