"""The TensorFlow runtime: devices, determinism, seeds and the tf.distribute strategy.

`configure()` must run before anything touches a device (logical CPU devices
can only be declared before the runtime starts); `create_strategy()` right after,
then `seed()`. A later run in the same process gets the same runtime and strategy,
or a one-line refusal (trainer/cluster/process_runtime.py).
"""
import contextlib
import os
import random

from absl import logging
import keras
import ml_collections
import tensorflow as tf

from trainer.cluster import process_runtime
from trainer.cluster import sharding
from trainer.errors import UserError


_POLICIES = {"float32": "float32", "bfloat16": "mixed_bfloat16", "float16": "mixed_float16"}


# The launcher's word on how many cores each process it starts on this machine may use
# (trainer/cluster/launch_tasks.py); a process without it takes every core it may run on.
CORES_ENV = "DISTLOOP_CORES"


def configure(runtime_config: ml_collections.ConfigDict) -> None:
  """Declares logical CPU devices, threads per op, determinism and the precision policy
  (before the runtime starts and before any model is built). A later run in this process:
  the same devices and threads, or UserError before anything changes
  (trainer/cluster/process_runtime.py)."""
  # Nothing listed otherwise: a multi-worker strategy sets up collectives first.
  if runtime_config.num_cpu_devices > 1 or process_runtime.cpu_devices_declared():
    process_runtime.declare_cpu_devices(runtime_config.num_cpu_devices)
  threads = threads_per_op_for(runtime_config)
  if threads:
    process_runtime.set_threads_per_op(threads)
  if runtime_config.deterministic:
    process_runtime.enable_determinism()
  # Compute in 16 bits, keep float32 variables (Keras mixed precision policies).
  keras.mixed_precision.set_global_policy(_POLICIES[runtime_config.mixed_precision])


def threads_per_op_for(runtime_config: ml_collections.ConfigDict) -> int:
  """The size of TensorFlow's intra-op pool for this process (0: leave TensorFlow's).

  Every op of every replica (the logical CPU devices of a process share the one pool)
  splits its work by the pool's size, and Eigen's and oneDNN's summation order follows
  that split: a conv gradient differs with 1, 2 and 4 threads, whatever the cores or
  devices (measured, TF 2.21). So under `runtime.deterministic` the size is the config's
  alone (`runtime.intra_op_threads`, else 1), never the cluster's shape: 2 workers, 2
  replicas in one process and a resume across them then compute the same sums.
  Otherwise each replica gets its share of the process's cores (the launcher's share
  of the machine: `DISTLOOP_CORES`), so replicas and processes run side by side instead
  of contending: measured 1.25x at batch 32 for 2 replicas on 2 cores
  (docs/performance.md). TF_NUM_INTRAOP_THREADS, where set, decides; with GPUs only an
  explicit `runtime.intra_op_threads` does (the replicas' ops are not on the CPU)."""
  if os.environ.get("TF_NUM_INTRAOP_THREADS"):
    return 0
  if runtime_config.intra_op_threads > 0:
    return runtime_config.intra_op_threads
  if tf.config.list_physical_devices("GPU"):
    return 0
  if runtime_config.deterministic:
    return 1
  if runtime_config.num_cpu_devices == 1 and not _launcher_share():
    return 0  # TensorFlow's own default is every core already
  return max(1, process_cores() // runtime_config.num_cpu_devices)


def process_cores() -> int:
  """The cores this process may use: the launcher's share, else every core it may run on."""
  if _launcher_share():
    return _launcher_share()
  return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _launcher_share() -> int:
  """DISTLOOP_CORES, if the launcher set it (0 if not)."""
  value = os.environ.get(CORES_ENV, "")
  return int(value) if value.isdigit() else 0


def seed(runtime_config: ml_collections.ConfigDict) -> None:
  """Seeds Python, numpy and TensorFlow. After `create_strategy()`: seeding starts
  the TensorFlow runtime, and multi-worker collectives must be set up before it."""
  keras.utils.set_random_seed(runtime_config.seed)


@contextlib.contextmanager
def keras_seeds_from(seed: int):
  """Around the model's build. Keras draws each layer's and initializer's default seed
  from Python's global `random` (keras.src.random.seed_generator.make_default_seed),
  which any library may draw from too, in any thread, between `seed()` and the build: a
  bucket client's retry jitter or upload boundary, the lease renewal's thread. Those
  draws changed a deterministic run's weights. Inside the block Keras draws from a
  generator of its own seeded from the config: the sequence the global one gives right
  after `seed()`, whatever else drew since; after it, the global generator goes on from
  where Keras left that sequence, as it would have undisturbed."""
  from keras.src.random import seed_generator  # pylint: disable=g-import-not-at-top
  drawn_from = getattr(seed_generator, "python_random", None)
  if drawn_from is None:  # a Keras that seeds otherwise (tests/buckets would show it)
    yield
    return
  own = random.Random(seed)
  seed_generator.python_random = own
  try:
    yield
  finally:
    seed_generator.python_random = drawn_from
    random.setstate(own.getstate())


class TrainingClusterResolver(tf.distribute.cluster_resolver.TFConfigClusterResolver):
  """TF_CONFIG's cluster without its `evaluator` job. The evaluator trains nothing and
  serves nothing (it evaluates checkpoints alone: trainer/api.py), yet a TFJob or Vertex
  TF_CONFIG lists it on every task; a strategy given it would count it as a peer (the
  coordinator of a parameter-server cluster connects to every task of the cluster)."""

  def cluster_spec(self) -> tf.train.ClusterSpec:
    jobs = super().cluster_spec().as_dict()
    jobs.pop("evaluator", None)
    return tf.train.ClusterSpec(jobs)


def cluster_resolver(runtime_config: ml_collections.ConfigDict):
  """Where this process sits in a cluster: TF_CONFIG if set (a Kubernetes Indexed Job's
  pod has it by now: trainer/api.py builds it first; its training tasks: no
  `evaluator`), else Slurm's environment (SLURM_PROCID inside an `srun` step), else
  None (a single process)."""
  if os.environ.get("TF_CONFIG"):
    return TrainingClusterResolver()
  if "SLURM_PROCID" in os.environ and "SLURM_STEP_NODELIST" in os.environ:
    return _slurm_resolver(runtime_config)
  return None


def _slurm_resolver(runtime_config: ml_collections.ConfigDict):
  """Every Slurm task a worker, ports from runtime.slurm_port_base on each node.

  On a node without GPUs the resolver's GPU allocation loop (a range with step
  gpus_per_task) would fail or drop tasks, so it is given a nominal GPU count
  and told not to touch CUDA_VISIBLE_DEVICES.
  """
  kwargs = {"port_base": runtime_config.slurm_port_base}
  if not tf.config.list_physical_devices("GPU"):
    kwargs.update(gpus_per_node=1024, gpus_per_task=1, auto_set_gpu=False)
  try:
    resolver = tf.distribute.cluster_resolver.SlurmClusterResolver(**kwargs)
    resolver.cluster_spec()  # resolves task_type and task_id
  except (RuntimeError, ValueError, KeyError) as e:
    raise UserError(f"cannot read the Slurm environment: {e}") from None
  return resolver


def create_strategy(runtime_config: ml_collections.ConfigDict) -> tf.distribute.Strategy:
  """The strategy of `runtime.strategy`: built once per process for its kind, devices and
  options, the same object for a later run (a second one would reuse the first's
  collective keys: trainer/cluster/process_runtime.py). Multi-worker strategies come
  first: they must set up collectives before anything (even listing devices) starts
  the runtime."""
  name = runtime_config.strategy
  if name == "multi_worker_mirrored":
    # One replica per GPU of every worker (one per worker on CPU-only machines).
    resolver = cluster_resolver(runtime_config)
    options = communication_options(runtime_config)
    return process_runtime.strategy(
        process_runtime.cluster_key(name, resolver, runtime_config.all_reduce_bytes_per_pack,
                                    runtime_config.all_reduce_implementation),
        lambda: tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=resolver,
                                                         communication_options=options),
        cluster=True)
  if name == "parameter_server":
    resolver = _parameter_server_resolver(runtime_config)
    return process_runtime.strategy(
        process_runtime.cluster_key(name, resolver, runtime_config.variable_partitioner),
        lambda: _parameter_server_strategy(resolver, runtime_config), cluster=True)
  if name == "tpu":
    return process_runtime.strategy((name,), _tpu_strategy, cluster=True)
  if name == "default":
    return tf.distribute.get_strategy()
  if name not in ("one_device", "mirrored", "central_storage"):
    raise UserError(f"runtime.strategy={name!r} is unknown")
  gpus = [d.name for d in tf.config.list_logical_devices("GPU")]
  # All GPUs when there are any; else N logical CPU devices (runtime.num_cpu_devices).
  local_devices = gpus or [d.name for d in tf.config.list_logical_devices("CPU")]
  if name == "one_device":
    local_devices = local_devices[:1]
  return process_runtime.strategy((name, *local_devices),
                                  lambda: _local_strategy(name, local_devices))


def _local_strategy(name: str, local_devices: list[str]) -> tf.distribute.Strategy:
  if name == "one_device":
    return tf.distribute.OneDeviceStrategy(local_devices[0])
  if name == "mirrored":
    return tf.distribute.MirroredStrategy(local_devices)
  # central_storage: variables on the CPU, compute replicated over the local devices.
  return tf.distribute.experimental.CentralStorageStrategy(
      compute_devices=local_devices, parameter_device="/cpu:0")


def _parameter_server_resolver(runtime_config: ml_collections.ConfigDict):
  resolver = cluster_resolver(runtime_config)
  cluster = resolver.cluster_spec().as_dict() if resolver else {}
  if not cluster.get("ps") or not cluster.get("worker"):
    raise UserError("runtime.strategy='parameter_server' needs a cluster with 'ps' and 'worker' "
                    "tasks: start it with `python -m trainer.launch --num_workers=N --num_ps=M` "
                    "or set TF_CONFIG")
  return resolver


def _parameter_server_strategy(resolver, runtime_config: ml_collections.ConfigDict):
  num_ps = len(resolver.cluster_spec().as_dict()["ps"])
  # runtime.variable_partitioner: large variables split over the servers (at most one
  # shard per server); trainer/cluster/sharding.py sees the trainer through it.
  return tf.distribute.experimental.ParameterServerStrategy(
      resolver, variable_partitioner=sharding.partitioner(runtime_config.variable_partitioner,
                                                          num_ps))


def _tpu_strategy():
  try:
    resolver = tf.distribute.cluster_resolver.TPUClusterResolver()
    tf.config.experimental_connect_to_cluster(resolver)
    tf.tpu.experimental.initialize_tpu_system(resolver)
  except (ValueError, RuntimeError, tf.errors.OpError) as e:
    first_line = (str(e).strip().splitlines() or [type(e).__name__])[0]
    raise UserError(f"runtime.strategy='tpu': no TPU found ({first_line[:200]})") from None
  return tf.distribute.TPUStrategy(resolver)


def serve(resolver) -> tf.distribute.Server:
  """Starts this task's gRPC server (the worker and ps tasks of a parameter-server
  cluster, while the chief, the coordinator, trains). It serves from its own
  threads until the process exits; the caller waits for a stop signal."""
  return tf.distribute.Server(resolver.cluster_spec(), job_name=resolver.task_type,
                              task_index=resolver.task_id, protocol="grpc", start=True)


def has_accelerator(strategy: tf.distribute.Strategy) -> bool:
  """A GPU or TPU does the steps (not only the CPU)."""
  return (isinstance(strategy, tf.distribute.TPUStrategy)
          or bool(tf.config.list_logical_devices("GPU")))


def cpu_kernels() -> str:
  """Which CPU kernels this process runs: "oneDNN" or "Eigen" (see trainer/__init__.py)."""
  from tensorflow.python.util import _pywrap_util_port  # pylint: disable=g-import-not-at-top
  return "oneDNN" if _pywrap_util_port.IsMklEnabled() else "Eigen"


def threads_per_op() -> int:
  """TensorFlow's intra-op threads (0: its default, every core; see threads_per_op_for)."""
  return tf.config.threading.get_intra_op_parallelism_threads()


_VARIABLES_OFF_THE_COMPUTE_DEVICE = (
    (tf.distribute.experimental.ParameterServerStrategy, "parameter_server"),
    (tf.distribute.experimental.CentralStorageStrategy, "central_storage"))


def variables_off_the_compute_device(strategy: tf.distribute.Strategy) -> str | None:
  """The strategy's name where the variables live on another device than the step's ops
  (a parameter server, the CPU under central_storage), else None."""
  return next((name for kind, name in _VARIABLES_OFF_THE_COMPUTE_DEVICE
               if isinstance(strategy, kind)), None)


def jit_compile(runtime_config: ml_collections.ConfigDict,
                strategy: tf.distribute.Strategy) -> bool:
  """runtime.jit_compile: "true", "false", or "auto" = XLA on accelerators only (measured:
  several times faster on a GPU at small batch, slower for the seed CNN on a CPU)."""
  # Seen on an H100: an XLA cluster on the compute device cannot read a variable that
  # lives elsewhere ("Trying to access resource ... located in device ..."): on a
  # parameter server, or on the CPU under central_storage.
  remote_variables = variables_off_the_compute_device(strategy)
  if runtime_config.jit_compile == "true" and remote_variables:
    raise UserError(f"runtime.jit_compile=true cannot run under the {remote_variables} "
                    "strategy: XLA on the compute device cannot reach variables kept on "
                    "another device; set runtime.jit_compile=auto or false")
  if runtime_config.jit_compile != "auto":
    return runtime_config.jit_compile == "true"
  if remote_variables:
    return False
  # XLA on a GPU has no deterministic kernels for some gradients (MaxPool's, TF 2.21):
  # there runtime.deterministic wins.
  return has_accelerator(strategy) and (isinstance(strategy, tf.distribute.TPUStrategy)
                                        or not runtime_config.deterministic)


def communication_options(runtime_config: ml_collections.ConfigDict):
  """How the trainer's one gradient all-reduce is packed and implemented."""
  implementation = {
      "auto": tf.distribute.experimental.CommunicationImplementation.AUTO,
      "ring": tf.distribute.experimental.CommunicationImplementation.RING,
      "nccl": tf.distribute.experimental.CommunicationImplementation.NCCL,
  }[runtime_config.all_reduce_implementation]
  return tf.distribute.experimental.CommunicationOptions(
      bytes_per_pack=runtime_config.all_reduce_bytes_per_pack, implementation=implementation)


def start(config: ml_collections.ConfigDict, splits, *, training: bool
          ) -> tuple[tf.distribute.Strategy, bool]:
  """(the strategy, whether this process is the chief) of `config`'s runtime, started
  (devices, determinism, the strategy, the seeds), with the data checked against it: each
  batch divisible by the replicas, the splits' batches within memory, a tf.data stream's
  examples of fixed shape with one label."""
  from input_pipelines import batching  # pylint: disable=g-import-not-at-top
  from input_pipelines import memory  # pylint: disable=g-import-not-at-top
  from input_pipelines import sources  # pylint: disable=g-import-not-at-top
  from input_pipelines.native_output import native_startup_silenced  # pylint: disable=g-import-not-at-top
  from trainer.cluster import preemption  # pylint: disable=g-import-not-at-top
  with native_startup_silenced():
    if config.runtime.strategy == "multi_worker_mirrored":
      preemption.end_start_up()  # from the runtime on, workers stop together (agreed)
    configure(config.runtime)
    strategy = create_strategy(config.runtime)
    seed(config.runtime)
  preemption.reinstall()  # a multi-worker runtime installs a SIGTERM handler of its own
  if process_runtime.determinism_kept(config.runtime.deterministic):
    logging.warning("runtime.deterministic=false: an earlier run in this process enabled op "
                    "determinism, which TensorFlow keeps on for the process: this run's "
                    "kernels are deterministic too")
  check_batch_divisible(strategy, config.train.global_batch_size,
                        config.train.accumulation_steps)
  chief, processes = is_chief(strategy), num_workers(strategy)
  memory.check_batches(*splits, train_batch=config.train.global_batch_size if training else None,
                       eval_batch=config.eval.global_batch_size, processes=processes)
  for source in splits:  # a tf.data stream: fixed-shape examples, one label, not empty
    if isinstance(source, sources.StreamSource):
      batching.check_stream(source)
  return strategy, chief


def check_batch_divisible(strategy: tf.distribute.Strategy, global_batch_size: int,
                          accumulation_steps: int = 1) -> None:
  replicas = strategy.num_replicas_in_sync
  if global_batch_size % replicas:
    raise UserError(f"train.global_batch_size={global_batch_size} is not divisible by the "
                    f"{replicas} replicas in sync")
  if global_batch_size % (replicas * accumulation_steps):
    raise UserError(f"train.global_batch_size={global_batch_size} is not divisible into "
                    f"train.accumulation_steps={accumulation_steps} micro-batches on each of "
                    f"the {replicas} replica(s)")


def is_chief(strategy: tf.distribute.Strategy) -> bool:
  """Only the chief writes checkpoints, summaries, exports and summary.json."""
  resolver = getattr(strategy, "cluster_resolver", None)
  if resolver is None or not resolver.task_type:
    return True
  if resolver.task_type == "chief":
    return True
  has_chief = "chief" in resolver.cluster_spec().as_dict()
  return resolver.task_type == "worker" and resolver.task_id == 0 and not has_chief


def num_workers(strategy: tf.distribute.Strategy) -> int:
  """Processes that run training steps: every `chief` and `worker` task of a synchronous
  cluster (a Kubeflow TFJob names one of them `chief`), the `worker` tasks alone under
  parameter_server (whose chief only coordinates); 1 for a local strategy."""
  resolver = getattr(strategy, "cluster_resolver", None)
  if resolver is None or not resolver.task_type:
    return 1
  cluster = resolver.cluster_spec().as_dict()
  jobs = (("worker",) if isinstance(strategy, tf.distribute.experimental.ParameterServerStrategy)
          else ("chief", "worker"))
  return max(1, sum(len(cluster.get(job, [])) for job in jobs))


def fuses_whole_step(runtime_config: ml_collections.ConfigDict,
                     strategy: tf.distribute.Strategy, jit_compile: bool) -> bool:
  """Whether one XLA cluster can hold the whole step, optimizer update included: one
  replica of the default or one_device strategy. MirroredStrategy refuses the update's
  merge_call inside an XLA function on GPUs (seen on an H100, even with one GPU), and a
  parameter server's variables are out of XLA's reach."""
  return (jit_compile and strategy.num_replicas_in_sync == 1
          and runtime_config.strategy in ("default", "one_device"))


def coordinator(strategy: tf.distribute.Strategy):
  """The ClusterCoordinator of a parameter-server strategy, else None."""
  if isinstance(strategy, tf.distribute.experimental.ParameterServerStrategy):
    return tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
  return None
