"""One throughput measurement in this (fresh) process; prints one JSON line.

`python -m benchmarks.runners --runner=NAME --batch=B --replicas=R --steps=S`:

- `distloop`: the trainer CLI itself (run in this process, so peak RSS is its own);
  examples/s from summary.json (steady state: the first, tracing loop left out).
- `fit`: Keras `model.fit` on the same CNN, optimizer, batch, strategy and data, at
  its best of `steps_per_execution` in {1, L} x `jit_compile` in {False, True}.
- `bare`: the minimal correct `tf.function` loop (`optimizer.apply_gradients` inside
  `strategy.run`): the ceiling.
- `pipeline`: distloop's input pipeline alone (`batching.train_dataset`), iterated.

`fit`, `bare` and `pipeline` report marginal throughput: (S2 - S1) * B over the time
difference of runs of S1 and S2 steps after a warm-up, so tracing and set-up cancel out.
"""
import json
import os
import sys
import tempfile
import time

from absl import app
from absl import flags

_RUNNER = flags.DEFINE_enum("runner", None, ["distloop", "fit", "bare", "pipeline"], "what")
_BATCH = flags.DEFINE_integer("batch", 32, "global batch size")
_REPLICAS = flags.DEFINE_integer("replicas", 1, "1: default strategy; N: mirrored on N CPUs")
_STEPS = flags.DEFINE_integer("steps", 1000, "steps of the timed run")
_STEPS_PER_LOOP = flags.DEFINE_integer("steps_per_loop", 50, "distloop loop / fit execution")
_CHECKPOINT_INTERVAL = flags.DEFINE_integer("checkpoint_interval", 0, "distloop; 0 = at the end")


def _peak_rss_mb() -> float:
  with open("/proc/self/status") as f:
    for line in f:
      if line.startswith("VmHWM:"):
        return int(line.split()[1]) / 1024
  return 0.0


def _distloop() -> dict:
  import runpy  # pylint: disable=g-import-not-at-top
  with tempfile.TemporaryDirectory() as model_dir:
    steps = _STEPS.value
    sys.argv = [
        "trainer", "--config=synthetic", f"--model_dir={model_dir}",
        f"--config.train.steps={steps}", f"--config.train.global_batch_size={_BATCH.value}",
        f"--config.train.steps_per_loop={_STEPS_PER_LOOP.value}",
        f"--config.checkpoint.interval={_CHECKPOINT_INTERVAL.value or steps}",
        *([f"--config.runtime.strategy=mirrored", f"--config.runtime.num_cpu_devices="
           f"{_REPLICAS.value}"] if _REPLICAS.value > 1 else [])]
    try:
      runpy.run_module("trainer", run_name="__main__", alter_sys=True)
    except SystemExit as e:
      if e.code not in (0, None):
        raise
    with open(os.path.join(model_dir, "summary.json")) as f:
      summary = json.load(f)
  return {"examples_per_sec": summary["examples_per_sec"],
          "checkpoint_time_sec": summary["checkpoint_time_sec"]}


def _setup():
  """(strategy, splits, model_config): the runtime as distloop sets it up."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import input_pipelines  # pylint: disable=g-import-not-at-top
  from configs import synthetic  # pylint: disable=g-import-not-at-top
  config = synthetic.get_config()
  if _REPLICAS.value > 1:
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * _REPLICAS.value)
    strategy = tf.distribute.MirroredStrategy(
        [d.name for d in tf.config.list_logical_devices("CPU")])
  else:
    strategy = tf.distribute.get_strategy()
  tf.keras.utils.set_random_seed(0)
  return strategy, input_pipelines.load(config.data, 0), config.model


def _in_memory_dataset(splits):
  """The same examples as float32 [0, 1] (28, 28, 1), batched, repeated, prefetched."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  images = (splits.train_images.astype("float32") / 255.0)[..., None]
  return (tf.data.Dataset.from_tensor_slices((images, splits.train_labels))
          .shuffle(len(images), seed=0).repeat()
          .batch(_BATCH.value, drop_remainder=True).prefetch(tf.data.AUTOTUNE))


def _marginal(run) -> float:
  """Examples/s between runs of S/4 and S steps (after `run` warmed up)."""
  short, long = max(_STEPS.value // 4, 1), _STEPS.value
  run(short)  # warm-up: tracing, compilation, first iterator
  start = time.perf_counter()
  run(short)
  t_short = time.perf_counter() - start
  start = time.perf_counter()
  run(long)
  t_long = time.perf_counter() - start
  return (long - short) * _BATCH.value / max(t_long - t_short, 1e-9)


def _fit() -> dict:
  import keras  # pylint: disable=g-import-not-at-top
  import models  # pylint: disable=g-import-not-at-top
  strategy, splits, model_config = _setup()
  dataset = _in_memory_dataset(splits)
  best = None
  for steps_per_execution in (1, _STEPS_PER_LOOP.value):
    for jit_compile in (False, True):
      with strategy.scope():
        model = models.build(model_config)
        model.compile(optimizer=keras.optimizers.Adam(1e-3),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"], steps_per_execution=steps_per_execution,
                      jit_compile=jit_compile)
      rate = _marginal(lambda n: model.fit(dataset, steps_per_epoch=n, epochs=1, verbose=0))
      if best is None or rate > best[0]:
        best = (rate, f"steps_per_execution={steps_per_execution}, jit_compile={jit_compile}")
  return {"examples_per_sec": best[0], "setting": best[1]}


def _bare() -> dict:
  import keras  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import models  # pylint: disable=g-import-not-at-top
  strategy, splits, model_config = _setup()
  with strategy.scope():
    model = models.build(model_config)
    optimizer = keras.optimizers.Adam(1e-3)
  loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)
  iterator = iter(strategy.experimental_distribute_dataset(_in_memory_dataset(splits)))

  def step(images, labels):
    with tf.GradientTape() as tape:
      loss = tf.nn.compute_average_loss(loss_fn(labels, model(images, training=True)),
                                        global_batch_size=_BATCH.value)
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))  # Keras all-reduces

  @tf.function
  def loop(num_steps):
    for _ in tf.range(num_steps):
      strategy.run(step, args=next(iterator))

  def run(n):
    for _ in range(n // _STEPS_PER_LOOP.value):
      loop(tf.constant(_STEPS_PER_LOOP.value))
    optimizer.iterations.numpy()  # host sync
  return {"examples_per_sec": _marginal(run)}


def _pipeline() -> dict:
  from input_pipelines import batching  # pylint: disable=g-import-not-at-top
  _, splits, _ = _setup()
  iterator = iter(batching.train_dataset(splits, seed=0, global_batch_size=_BATCH.value,
                                         start_example=0))

  def run(n):
    for _ in range(n):
      next(iterator)
  return {"examples_per_sec": _marginal(run)}


def main(argv):
  del argv
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
  result = {"distloop": _distloop, "fit": _fit, "bare": _bare, "pipeline": _pipeline}[
      _RUNNER.value]()
  result["peak_rss_mb"] = _peak_rss_mb()
  print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
  app.run(main)
