"""What benchmarks/throughput.py compares distloop with, one measurement per process.

`python -m benchmarks.runners --runner=NAME --batch=B --replicas=R --steps=S`
measures one thing in this (fresh) process and prints one `RESULT {json}` line
(or `ERROR <one line>` and exits 1):

- `fit`: Keras `model.fit` on the seed CNN (`models.build` of configs/synthetic.py)
  with Adam(1e-3) and loss + accuracy metrics, at global batch B, under the
  strategy distloop would use (default for 1 replica, MirroredStrategy over R
  logical CPU devices otherwise), fed from the same examples held in memory.
  One `--steps_per_execution` / `--jit_compile` setting per process: a failed
  setting (Keras bugs, XLA limits) must not poison the next one's collectives.
- `bare`: the least a correct loop does (meant as the ceiling): `steps_per_loop` steps of
  `strategy.run(step)` in one tf.function, `optimizer.apply_gradients` inside
  the replica step (Keras 3 all-reduces there by itself, which is right for a
  loop that does not reduce explicitly), no metrics, no checks, no summaries.
- `bare_xla`: the same loop with the whole step -- forward, backward and the Adam
  update -- compiled by XLA (`jit_compile=True` on the replica step): the second
  ceiling, the one that matters on accelerators. One replica only (XLA cannot
  compile the update's cross-replica part).
- `orbit`: TF Model Garden's loop, as its users write it: an `orbit.StandardTrainer`
  whose `train_step` is the custom-training-loop tutorial's (`strategy.run` of a
  replica step: per-example loss, `tf.nn.compute_average_loss` over the global
  batch, `tape.gradient`, `optimizer.apply_gradients`, which sums the gradients
  over replicas; a loss Mean and an accuracy metric, as Model Garden's trainers
  keep), its steps in orbit's `tf.while_loop` (`use_tf_while_loop=True`), driven
  by `orbit.Controller.train` in loops of `steps_per_loop`. The model and Adam
  are tf-keras's (`TF_USE_LEGACY_KERAS=1`, what orbit is written for) and start
  from the same weights as the others. Runs only under an interpreter that has
  `orbit` and `tf_keras` (benchmarks/orbit_env.sh makes one; not a distloop
  dependency).
- `pipeline`: distloop's own input pipeline (`batching.train_dataset` through
  `distribute_datasets_from_function`, as the trainer consumes it; the synthetic
  arrays in memory, or converted records on disk with --data_dir), drained by a
  tf.function that does nothing else: what it can deliver to training.

Why fresh processes: TensorFlow keeps thread pools, caches and allocator state
for the life of a process, and cannot host two strategies of different sizes in
one; each measurement starts where a user's job starts.

CPU kernels: as TF_ENABLE_ONEDNN_OPTS says (throughput.py sets it for every
child), else distloop's default (trainer/__init__.py); RESULT names the kernels
that ran.

What is timed: the steady rate, as distloop's loop-boundary timestamps measure it.
fit: after a warm-up call (tracing, compilation), one call of S steps, timed from
the end of its first execution to the end of its last (a callback's timestamps),
which leaves out the call's set-up and its new iterator filling the shuffle buffer.
(The difference of a short and a long call's times, used before, swung from 1.4k
to 5.8k examples/s between runs of fit under XLA on the CPU.) bare: marginal
throughput: after a warm-up call, a run of S/4 steps and one of S steps are timed
and (S - S/4) * B over the difference of their times leaves out per-call costs.
orbit: the same marginal throughput, each run one `Controller.train` call of whole
loops (the controller's per-loop log line and metric read are in).
"""
import gc
import json
import os
import re
import time

from absl import app
from absl import flags
import ml_collections

_RUNNER = flags.DEFINE_enum("runner", None, ["fit", "bare", "bare_xla", "orbit", "pipeline"],
                            "what to measure", required=True)
_MODEL = flags.DEFINE_enum("model", "mnist_cnn", ["mnist_cnn", "mlp"], "the model of every runner")
_MLP_UNITS = flags.DEFINE_integer("mlp_units", 128, "--model=mlp: hidden units")
_BATCH = flags.DEFINE_integer("batch", 32, "global batch size")
_REPLICAS = flags.DEFINE_integer("replicas", 1, "1: default strategy; N: mirrored on N CPUs")
_STEPS = flags.DEFINE_integer("steps", 1000, "steps of the long timed run (the short one: 1/4)")
_STEPS_PER_LOOP = flags.DEFINE_integer("steps_per_loop", 50,
                                       "steps per tf.function call (bare, pipeline) and per "
                                       "orbit Controller loop; every "
                                       "timed run is a whole number of them")
_STEPS_PER_EXECUTION = flags.DEFINE_integer("steps_per_execution", 1, "fit: compile()'s")
_JIT_COMPILE = flags.DEFINE_bool("jit_compile", False, "fit: compile()'s (XLA)")
_DATA_DIR = flags.DEFINE_string("data_dir", "", "pipeline: read converted records "
                                "(data.name='records') from here instead of the synthetic "
                                "arrays in memory")
_COLD = flags.DEFINE_bool("cold", False, "pipeline: time one run of --steps right after the "
                          "first step (no warm-up): with the page cache dropped, reads hit the disk")
_SEED = 0  # runtime.seed of configs/synthetic.py: the same weights and data as distloop


def _setup():
  """(strategy, splits, config): the runtime as trainer/cluster/runtime.py sets it up."""
  import keras  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from configs import synthetic  # pylint: disable=g-import-not-at-top
  import input_pipelines  # pylint: disable=g-import-not-at-top
  from input_pipelines.datasets import synthetic as synthetic_data  # pylint: disable=g-import-not-at-top
  config = synthetic.get_config()
  with config.unlocked():
    config.model.name, config.model.mlp_units = _MODEL.value, _MLP_UNITS.value
  splits = synthetic_data.build(config.data, _SEED)
  if not config.model.num_classes:  # 0: from the data, as the trainer resolves it
    with config.unlocked():
      config.model.num_classes = input_pipelines.num_classes(*splits.sources("synthetic"))[0]
  if _REPLICAS.value > 1:  # logical devices (and their share of the cores), as distloop's
    from trainer.cluster import runtime  # pylint: disable=g-import-not-at-top
    with config.unlocked():
      config.runtime.num_cpu_devices = _REPLICAS.value
    runtime.configure(config.runtime)
    strategy = tf.distribute.MirroredStrategy(
        [d.name for d in tf.config.list_logical_devices("CPU")])
  else:
    strategy = tf.distribute.get_strategy()
  keras.utils.set_random_seed(_SEED)
  return strategy, splits, config


def _IMAGES_SPEC():  # pylint: disable=invalid-name
  """The seed CNN's input, as distloop's pipeline delivers it."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  return tf.TensorSpec([None, 28, 28, 1], tf.float32)


def _in_memory_dataset(splits):
  """fit's and bare's input: distloop's training examples as float32 in [0, 1],
  (28, 28, 1), reshuffled every epoch, batched, prefetched: the usual tf.data
  idiom for arrays in memory; repeating, it lets one fit call run any number of
  steps."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  images = (splits.train_images.astype("float32") / 255.0)[..., None]
  return (tf.data.Dataset.from_tensor_slices((images, splits.train_labels))
          .shuffle(len(images), seed=_SEED).repeat()
          .batch(_BATCH.value, drop_remainder=True).prefetch(tf.data.AUTOTUNE))


def _whole_loops(steps: int) -> int:
  """Rounded down to whole loops (fit's epochs must be whole executions too), at least one."""
  loop = _STEPS_PER_LOOP.value
  return max(loop, steps // loop * loop)


def _marginal(run) -> float:
  """Steady examples/s of `run(num_steps)`: warm up, then time S/4 and S steps."""
  short = _whole_loops(_STEPS.value // 4)
  long = max(_whole_loops(_STEPS.value), 2 * short)
  run(short)  # warm-up: tracing, compilation, the first iterator
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
  strategy, splits, config = _setup()
  with strategy.scope():
    model = models.build(config.model, _IMAGES_SPEC())
    model.compile(optimizer=keras.optimizers.Adam(config.train.learning_rate),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"],  # distloop computes loss and accuracy too
                  steps_per_execution=_STEPS_PER_EXECUTION.value,
                  jit_compile=_JIT_COMPILE.value)
  dataset = _in_memory_dataset(splits)

  class Boundaries(keras.callbacks.Callback):
    """When each execution (steps_per_execution steps) ended: fit's loop boundaries."""

    def __init__(self):
      super().__init__()
      self.times = []

    def on_train_batch_end(self, batch, logs=None):
      self.times.append(time.perf_counter())

  model.fit(dataset, steps_per_epoch=_whole_loops(_STEPS.value // 4), epochs=1,
            verbose=0)  # warm-up: tracing, compilation
  boundaries = Boundaries()
  steps = _whole_loops(_STEPS.value)
  model.fit(dataset, steps_per_epoch=steps, epochs=1, verbose=0, callbacks=[boundaries])
  times = boundaries.times
  if len(times) < 3:
    raise ValueError(f"{steps} steps are too few to time fit: raise --steps")
  steps_between = (len(times) - 1) * _STEPS_PER_EXECUTION.value  # one time per execution
  return {"examples_per_sec": steps_between * _BATCH.value / (times[-1] - times[0])}


def _bare(jit_compile: bool = False) -> dict:
  import keras  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import models  # pylint: disable=g-import-not-at-top
  strategy, splits, config = _setup()
  with strategy.scope():
    model = models.build(config.model, _IMAGES_SPEC())
    optimizer = keras.optimizers.Adam(config.train.learning_rate)
    # Slots now: created lazily inside the tf.function, they break the 2-replica
    # trace ("You must feed a value for placeholder tensor ... in cond").
    optimizer.build(model.trainable_variables)
  loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)
  iterator = iter(strategy.experimental_distribute_dataset(_in_memory_dataset(splits)))
  variables = model.trainable_variables

  def step(images, labels):
    with tf.GradientTape() as tape:
      per_example_loss = loss_fn(labels, model(images, training=True))
      loss = tf.nn.compute_average_loss(per_example_loss, global_batch_size=_BATCH.value)
    grads = tape.gradient(loss, variables)
    optimizer.apply_gradients(zip(grads, variables))  # Keras all-reduces in replica context

  if jit_compile:
    if _REPLICAS.value > 1:
      raise ValueError("bare_xla runs on one replica only")
    step = tf.function(step, jit_compile=True)

  @tf.function
  def loop(num_steps):
    for _ in tf.range(num_steps):
      strategy.run(step, args=next(iterator))

  def run(num_steps):
    for _ in range(num_steps // _STEPS_PER_LOOP.value):
      loop(tf.constant(_STEPS_PER_LOOP.value))
    optimizer.iterations.numpy()  # host sync: every step has run

  return {"examples_per_sec": _marginal(run)}


def _tf_keras_model(model_config, tf_keras):
  """models/mnist_cnn.py's or models/mlp.py's architecture in tf-keras layers (orbit's
  Keras); `set_weights` with the Keras 3 model's weights fails if the two drift apart."""
  if _MODEL.value == "mnist_cnn":
    layers = [tf_keras.layers.Conv2D(model_config.conv_filters, 3, activation="relu",
                                     name="conv"),
              tf_keras.layers.MaxPooling2D(2, name="pool"),
              tf_keras.layers.Flatten(name="flatten"),
              tf_keras.layers.Dense(model_config.dense_units, activation="relu", name="hidden")]
  else:
    layers = [tf_keras.layers.Flatten(name="flatten"),
              tf_keras.layers.Dense(model_config.mlp_units, activation="relu", name="hidden"),
              tf_keras.layers.Dropout(model_config.dropout_rate, name="dropout")]
  return tf_keras.Sequential(
      [tf_keras.Input(shape=_IMAGES_SPEC().shape[1:], name="images"), *layers,
       tf_keras.layers.Dense(model_config.num_classes, name="logits")], name=_MODEL.value)


def _orbit() -> dict:
  import orbit  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tf_keras  # pylint: disable=g-import-not-at-top
  import models  # pylint: disable=g-import-not-at-top
  if tf.keras.__name__.split(".")[0] != "tf_keras":
    raise ValueError("tf.keras is not tf-keras here: set TF_USE_LEGACY_KERAS=1 before "
                     "TensorFlow is imported")
  strategy, splits, config = _setup()
  initial_weights = models.build(config.model, _IMAGES_SPEC()).get_weights()  # seed 0, as all
  dataset = strategy.experimental_distribute_dataset(_in_memory_dataset(splits))
  loss_fn = tf_keras.losses.SparseCategoricalCrossentropy(
      from_logits=True, reduction=tf_keras.losses.Reduction.NONE)

  class Trainer(orbit.StandardTrainer):
    """The custom-training-loop tutorial's step in orbit's tf.while_loop."""

    def __init__(self):
      self.model = _tf_keras_model(config.model, tf_keras)
      self.model.set_weights(initial_weights)
      self.optimizer = tf_keras.optimizers.Adam(config.train.learning_rate)
      self.global_step = orbit.utils.create_global_step()  # as Model Garden's Trainer
      self.train_loss = tf_keras.metrics.Mean("loss", dtype=tf.float32)
      self.train_accuracy = tf_keras.metrics.SparseCategoricalAccuracy("accuracy")
      super().__init__(dataset, options=orbit.StandardTrainerOptions(
          use_tf_while_loop=True, use_tf_function=True))

    def train_loop_begin(self):
      self.train_loss.reset_states()
      self.train_accuracy.reset_states()

    def train_step(self, iterator):
      def replica_step(images, labels):
        with tf.GradientTape() as tape:
          logits = self.model(images, training=True)
          per_example_loss = loss_fn(labels, logits)
          loss = tf.nn.compute_average_loss(per_example_loss,
                                            global_batch_size=_BATCH.value)
        variables = self.model.trainable_variables
        grads = tape.gradient(loss, variables)
        # tf-keras sums the gradients over replicas here: the loss is over the global batch.
        self.optimizer.apply_gradients(zip(grads, variables))
        self.train_loss.update_state(tf.reduce_mean(per_example_loss))
        self.train_accuracy.update_state(labels, logits)
        self.global_step.assign_add(1)

      strategy.run(replica_step, args=next(iterator))

    def train_loop_end(self):
      return {"loss": self.train_loss.result(), "accuracy": self.train_accuracy.result()}

  with strategy.scope():
    trainer = Trainer()
  losses = []  # every loop's mean loss, as a tensor: read after the timed runs
  controller = orbit.Controller(trainer=trainer, strategy=strategy,
                                global_step=trainer.global_step,
                                steps_per_loop=_STEPS_PER_LOOP.value,
                                train_actions=[lambda output: losses.append(output["loss"])])

  def run(num_steps):
    controller.train(int(trainer.global_step.numpy()) + num_steps)  # syncs at every loop

  rate = _marginal(run)
  moved = max(float(abs(after - before).max())
              for after, before in zip(trainer.model.get_weights(), initial_weights))
  return {"examples_per_sec": rate, "steps": int(trainer.global_step.numpy()),
          "first_loop_loss": float(losses[0]), "last_loop_loss": float(losses[-1]),
          "largest_weight_change": moved}


def _pipeline() -> dict:
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from input_pipelines import batching  # pylint: disable=g-import-not-at-top
  strategy, splits, config = _setup()
  # As the trainer reads it: its replicas' shares of every batch, uint8 images scaled
  # on the device by the train step.
  source = splits.sources("synthetic")[0]
  if _DATA_DIR.value:
    from input_pipelines.records import records  # pylint: disable=g-import-not-at-top
    source = records.build(ml_collections.ConfigDict({"dir": _DATA_DIR.value}), _SEED)[0]
  iterator = iter(strategy.distribute_datasets_from_function(  # as trainer/loop/batches.py reads
      lambda context: batching.train_dataset(source, seed=config.runtime.seed,
                                             global_batch_size=_BATCH.value, start_example=0,
                                             input_context=context, decode_on_device=True)))

  @tf.function
  def drain(num_steps):  # consumed as the train loop consumes it: next() in a tf.range
    for _ in tf.range(num_steps):
      next(iterator)  # stateful: kept although unused  # noqa: F821  (deleted below, after its last call)

  def run(num_steps):
    for _ in range(num_steps // _STEPS_PER_LOOP.value):
      drain(tf.constant(_STEPS_PER_LOOP.value))  # noqa: F821  (as above)

  if _COLD.value:
    drain(tf.constant(1))  # tracing and the first reads
    start = time.perf_counter()
    run(_whole_loops(_STEPS.value))
    rate = _whole_loops(_STEPS.value) * _BATCH.value / (time.perf_counter() - start)
  else:
    rate = _marginal(run)
  # Reads run in tf.numpy_function: an iterator still alive when the interpreter
  # finalizes can deadlock its exit (a tf.data thread waits for the GIL forever).
  del drain, iterator, run
  gc.collect()
  return {"examples_per_sec": rate}


def _device() -> str:
  """What ran the steps: the first GPU's name, else the CPU."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  gpus = tf.config.list_physical_devices("GPU")
  if gpus:
    return tf.config.experimental.get_device_details(gpus[0]).get("device_name", "GPU")
  return "CPU"


def _one_line(error: Exception) -> str:
  """The gist of a (often multi-page) TensorFlow error."""
  text = re.sub(r" \(defined @ [^)]*\)", "", str(error))  # source paths of the variable
  status = re.search(r"\(0\) [A-Z_]+:\s*(.+)", text)  # "2 root error(s) found. (0) INVALID_..."
  if status:
    return status.group(1).strip()[:240]
  lines = [line.strip() for line in text.splitlines()
           if line.strip() and not line.startswith((" ", "\t", "[[", "Detected at node",
                                                    "Graph execution error"))]
  return f"{type(error).__name__}: {(lines or [''])[0][:240]}"


def main(argv):
  del argv
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # before TensorFlow is imported
  if _RUNNER.value == "orbit":
    os.environ["TF_USE_LEGACY_KERAS"] = "1"  # tf.keras is tf-keras: orbit's Keras
  from trainer.cluster import runtime  # pylint: disable=g-import-not-at-top  (picks the CPU kernels first)
  try:
    runners = {"fit": _fit, "bare": _bare, "bare_xla": lambda: _bare(jit_compile=True),
               "orbit": _orbit, "pipeline": _pipeline}
    result = {**runners[_RUNNER.value](), "device": _device(), "cpu_kernels": runtime.cpu_kernels()}
  except Exception as e:  # pylint: disable=broad-except
    print("ERROR " + _one_line(e), flush=True)
    raise
  print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
  app.run(main)
