"""The TensorFlow runtime: devices, determinism, seeds and the tf.distribute strategy.

`configure()` must run before anything touches a device (logical CPU devices
can only be declared before the runtime starts); `create_strategy()` right after.
"""
import keras
import ml_collections
import tensorflow as tf

from trainer.errors import UserError


def configure(runtime_config: ml_collections.ConfigDict) -> None:
  """Declares logical CPU devices, turns on determinism, seeds every RNG."""
  if runtime_config.num_cpu_devices > 1:
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * runtime_config.num_cpu_devices)
  if runtime_config.deterministic:
    tf.config.experimental.enable_op_determinism()
  keras.utils.set_random_seed(runtime_config.seed)


def create_strategy(runtime_config: ml_collections.ConfigDict) -> tf.distribute.Strategy:
  name = runtime_config.strategy
  gpus = [d.name for d in tf.config.list_logical_devices("GPU")]
  if name == "default":
    return tf.distribute.get_strategy()
  if name == "one_device":
    return tf.distribute.OneDeviceStrategy(gpus[0] if gpus else "/cpu:0")
  if name == "mirrored":
    # All GPUs when there are any; else N logical CPU devices (runtime.num_cpu_devices).
    devices = gpus or [d.name for d in tf.config.list_logical_devices("CPU")]
    return tf.distribute.MirroredStrategy(devices)
  raise UserError(f"runtime.strategy={name!r} is not yet supported")


def communication_options(runtime_config: ml_collections.ConfigDict):
  """How the trainer's one gradient all-reduce is packed and implemented."""
  implementation = {
      "auto": tf.distribute.experimental.CommunicationImplementation.AUTO,
      "ring": tf.distribute.experimental.CommunicationImplementation.RING,
      "nccl": tf.distribute.experimental.CommunicationImplementation.NCCL,
  }[runtime_config.all_reduce_implementation]
  return tf.distribute.experimental.CommunicationOptions(
      bytes_per_pack=runtime_config.all_reduce_bytes_per_pack, implementation=implementation)


def check_batch_divisible(strategy: tf.distribute.Strategy, global_batch_size: int) -> None:
  replicas = strategy.num_replicas_in_sync
  if global_batch_size % replicas:
    raise UserError(f"train.global_batch_size={global_batch_size} is not divisible by the "
                    f"{replicas} replicas in sync")


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
  """Processes that take part in the strategy's collectives (1 for a local strategy)."""
  resolver = getattr(strategy, "cluster_resolver", None)
  if resolver is None or not resolver.task_type:
    return 1
  cluster = resolver.cluster_spec().as_dict()
  return len(cluster.get("worker", [])) + len(cluster.get("chief", []))
