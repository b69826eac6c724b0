"""What one process's TensorFlow runtime fixes for its life, and so for every later run in it.

A notebook, a hyper-parameter sweep (Optuna, Keras Tuner) or a Ray worker calls
`trainer.run` several times in one process. Each run must give what a fresh process
gives it, or be refused in one line before it writes anything. Found by experiment
(TF 2.21, Keras 3):

- Logical CPU devices (runtime.num_cpu_devices), and with them the threads per op
  (trainer/cluster/runtime.py `threads_per_op_for`), are fixed once the runtime starts:
  another count is refused (a subprocess, or the same count).
- Op determinism, once enabled, stays enabled for the process (TF exports no way
  back): runtime.deterministic=false after a run that enabled it runs with deterministic
  kernels, and says so.
- A second strategy over the same devices reuses the first one's collective keys
  (instance 100 onward: "Shape mismatch in the collective instance 100" once the
  model changes, and the aborted collectives leave the process unusable). So one
  strategy per (kind, devices, options) is built and kept for the process's life:
  its keys go on counting, and each run's collectives are new ones.
- A cluster (multi_worker_mirrored with TF_CONFIG, parameter_server, tpu) is joined
  once per process: the same cluster again reuses its strategy (verified: two workers,
  and a parameter-server chief, each training three models in turn; a second
  MultiWorkerMirroredStrategy aborted its first collective), another is refused, and
  so is a multi-worker strategy after a local one (their collective keys collide).
- keras.backend.clear_session is not needed: a later run's checkpoint keys and weights
  equal a fresh process's (keys follow the model's structure, not Keras's per-process
  layer names; seeds are set per run).
"""
import json
from typing import Callable

import tensorflow as tf

from trainer.errors import UserError

_SUBPROCESS = "run each such training in a subprocess"

_strategies: dict[tuple, tf.distribute.Strategy] = {}  # one per (kind, devices, options)
_cluster: tuple | None = None  # the key of the cluster strategy this process joined
_determinism_enabled_by_a_run = False
_cpu_devices_declared = False


def declare_cpu_devices(count: int) -> bool:
  """Declares `count` logical CPU devices (1: TensorFlow's one CPU device), or checks
  that the running runtime has them. Returns whether anything changed. UserError: the
  runtime started with another count."""
  global _cpu_devices_declared
  _cpu_devices_declared = True  # from now on a later run checks its count too
  cpu = tf.config.list_physical_devices("CPU")[0]
  declared = tf.config.get_logical_device_configuration(cpu)
  if (len(declared) if declared else 1) == count:
    return False
  try:
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(count)])
  except RuntimeError:  # "Virtual devices cannot be modified after being initialized"
    running = len(tf.config.list_logical_devices("CPU"))
    raise UserError(
        f"runtime.num_cpu_devices={count}: TensorFlow in this process already runs with "
        f"{running} logical CPU device(s), fixed once it started (an earlier run or "
        f"TensorFlow code in this process); keep runtime.num_cpu_devices={running}, or "
        f"{_SUBPROCESS}") from None
  return True


def cpu_devices_declared() -> bool:
  """Whether a run of this process declared (or checked) logical CPU devices."""
  return _cpu_devices_declared


def set_threads_per_op(threads: int) -> None:
  """TensorFlow's intra-op threads; UserError if the running runtime has others (the
  summation order, so the result, follows the thread count)."""
  try:
    tf.config.threading.set_intra_op_parallelism_threads(threads)
  except RuntimeError:  # "Intra op parallelism cannot be modified after initialization."
    running = tf.config.threading.get_intra_op_parallelism_threads()
    raise UserError(
        f"TensorFlow in this process already runs {running or 'the default number of'} "
        f"thread(s) per op, fixed once it started, and this run needs {threads} (its "
        f"runtime.num_cpu_devices, runtime.deterministic or runtime.intra_op_threads: the "
        f"summation order follows it); call trainer.run before other TensorFlow code, or "
        f"{_SUBPROCESS}") from None


def determinism_kept(deterministic: bool) -> bool:
  """runtime.deterministic=false after a run of this process enabled op determinism:
  TensorFlow keeps it on, so this run's kernels are deterministic too (maybe slower).
  Not refused: a run that asks for no determinism is promised none, and one sample of
  its results is as right as another; the caller says so in one line."""
  return _determinism_enabled_by_a_run and not deterministic


def enable_determinism() -> None:
  global _determinism_enabled_by_a_run
  tf.config.experimental.enable_op_determinism()
  _determinism_enabled_by_a_run = True


def strategy(key: tuple, build: Callable[[], tf.distribute.Strategy], *,
             cluster: bool = False) -> tf.distribute.Strategy:
  """The process's strategy for `key` (kind, devices, options): built on the first
  run, the same object for every later one. `cluster`: joining a cluster, which a
  process does once (UserError for another cluster, or a local strategy after one)."""
  global _cluster
  if key in _strategies:
    return _strategies[key]
  if _cluster is not None:
    raise UserError(
        f"runtime.strategy={key[0]}: this process already joined a cluster "
        f"(runtime.strategy={_cluster[0]}) and TensorFlow cannot set up "
        f"{'another one' if cluster else 'a local strategy'} beside it; {_SUBPROCESS}")
  if cluster and _strategies:
    raise UserError(
        f"runtime.strategy={key[0]}: this process already ran "
        f"runtime.strategy={next(iter(_strategies))[0]}, and TensorFlow cannot set up a "
        f"{key[0]} strategy beside it (their collectives would collide); {_SUBPROCESS}")
  built = build()
  _strategies[key] = built
  if cluster:
    _cluster = key
  return built


def cluster_key(kind: str, resolver, *options) -> tuple:
  """The key of a cluster strategy: its kind, the cluster, this task and the options."""
  cluster = json.dumps(resolver.cluster_spec().as_dict(), sort_keys=True) if resolver else ""
  task = (getattr(resolver, "task_type", None), getattr(resolver, "task_id", None))
  return (kind, cluster, task, *map(str, options))
