"""What drawing Keras's random layers per example costs:
`python -m benchmarks.per_example_randomness`.

Under runtime.deterministic, every Keras draw of a train step whose first dimension is the
replica's batch draws the global batch's numbers and keeps this replica's rows
(trainer/task/randomness.py), so each replica draws N times its own share. This measures
the steady-state training throughput with those draws on (as distloop ships them) and
off (each replica drawing over its own share, as Keras does), on --replicas 1 (the
control: the same count of numbers either way) and N (mirrored on N logical CPU devices).

The model: the seed CNN has no Dropout (models/mnist_cnn.py), so every run trains
benchmarks/dropout_cnn.py, a model plug-in that is the seed CNN plus
Dropout(--dropout_rate) after its hidden dense layer. Off is the same plug-in's
`build_per_replica_draws`, which switches the draws off in its own process only
(no user-facing flag does). Otherwise the runs are the same `python -m trainer
--config=synthetic ... --config.runtime.deterministic=true` command, each a fresh process
in a fresh model_dir, on and off alternating (on/off, then off/on) over --rounds; the
rate is summary.json's `examples_per_sec` (the compiled loops after the first, tracing
one). Prints the medians, their ranges and the paired ratios on / off; then (--draw_cost)
the mask alone in this process, Keras's against the per-example one, beside a step's time.
Keep the machine quiet: 2 cores shared with anything else make every number noisier.
"""
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from absl import app
from absl import flags

from benchmarks import dropout_cnn

_ROUNDS = flags.DEFINE_integer("rounds", 5, "alternating on/off pairs of fresh processes "
                               "per replica count")
_REPLICAS = flags.DEFINE_list("replicas", ["1", "2"], "replica counts: 1 = default "
                              "strategy (the control), N = mirrored on N logical CPU devices")
_STEPS = flags.DEFINE_integer("steps", 4000, "training steps of every run (4000 at batch "
                              "64: 11-28 s of steady state on 2 cores)")
_BATCH = flags.DEFINE_integer("global_batch_size", 64, "global batch of every run")
_STEPS_PER_LOOP = flags.DEFINE_integer("steps_per_loop", 50, "steps per compiled loop")
_DROPOUT_RATE = flags.DEFINE_float("dropout_rate", 0.5, "the Dropout after the hidden layer")
_DRAW_COST = flags.DEFINE_bool("draw_cost", True, "also time, in this process after the runs, "
                               "one replica's mask alone: Keras's dropout over its share vs "
                               "the global batch's draw and its rows")

_DENSE_UNITS = 64  # configs/common.py's model.dense_units: the width Dropout masks
_MODES = {"on": "build", "off": "build_per_replica_draws"}


def _command(model_dir: str, mode: str, replicas: int) -> list[str]:
  return [sys.executable, "-m", "trainer", "--config=synthetic", f"--model_dir={model_dir}",
          f"--config.model.name=benchmarks.dropout_cnn:{_MODES[mode]}",
          "--config.model.num_classes=10", f"--config.model.dense_units={_DENSE_UNITS}",
          f"--config.model.dropout_rate={_DROPOUT_RATE.value}",
          "--config.runtime.deterministic=true",
          f"--config.runtime.strategy={'default' if replicas == 1 else 'mirrored'}",
          f"--config.runtime.num_cpu_devices={replicas}",
          f"--config.train.steps={_STEPS.value}",
          f"--config.train.global_batch_size={_BATCH.value}",
          f"--config.train.steps_per_loop={_STEPS_PER_LOOP.value}",
          f"--config.checkpoint.interval={_STEPS.value}", "--config.eval.interval=0"]


def _run(mode: str, replicas: int) -> dict:
  """One fresh `python -m trainer` process: summary.json, and the steady window's length."""
  with tempfile.TemporaryDirectory(prefix="distloop_per_example_") as root:
    command = _command(os.path.join(root, "run"), mode, replicas)
    done = subprocess.run(command, capture_output=True, text=True,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    if done.returncode != 0:
      tail = "\n".join(done.stderr.splitlines()[-20:])
      raise SystemExit(f"{' '.join(command)}\nexited {done.returncode}:\n{tail}")
    if (dropout_cnn.SWITCHED_OFF in done.stderr) != (mode == "off"):
      raise SystemExit(f"the {mode} run did not say what benchmarks/dropout_cnn.py did: "
                       f"{' '.join(command)}")
    with open(os.path.join(root, "run", "summary.json")) as f:
      summary = json.load(f)
  rate = summary["examples_per_sec"]
  steady = (_STEPS.value - _STEPS_PER_LOOP.value) * _BATCH.value / rate
  return {"examples_per_sec": rate, "steady_seconds": steady}


def _draw_microseconds(replicas: int, calls: int = 5000, repeats: int = 7) -> dict:
  """Microseconds one replica's Dropout mask takes, forward only, at one thread per op
  (runtime.deterministic's): Keras's (stateless_dropout over the replica's rows) and
  distloop's per-example one (the global batch's uniform numbers, this replica's rows,
  compared and applied), less a loop that does nothing else (the best of `repeats` runs of
  `calls` calls in one tf.function each)."""
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
  import tensorflow as tf  # pylint: disable=g-import-not-at-top  (after the runs: a lean parent)
  tf.config.threading.set_intra_op_parallelism_threads(1)
  rows, rate = _BATCH.value // replicas, _DROPOUT_RATE.value
  inputs = tf.random.stateless_normal([rows, _DENSE_UNITS], seed=[0, 0])

  def nothing(seed):
    del seed
    return inputs

  def keras_dropout(seed):
    return tf.nn.experimental.stateless_dropout(inputs, rate, seed=seed)

  def per_example(seed):
    drawn = tf.random.stateless_uniform([_BATCH.value, _DENSE_UNITS], seed=seed)
    keep = drawn[(replicas - 1) * rows:replicas * rows] >= rate
    return tf.where(keep, inputs * (1 / (1 - rate)), tf.zeros([]))

  def loop_of(mask):
    @tf.function
    def loop():
      total = tf.constant(0.0)
      for i in tf.range(calls):
        total += mask(tf.stack([tf.cast(i, tf.int64), tf.constant(1, tf.int64)]))[0, 0]
      return total

    loop()  # tracing
    return loop

  loops = {"alone": loop_of(nothing), "keras": loop_of(keras_dropout),
           "per_example": loop_of(per_example)}
  best = dict.fromkeys(loops, float("inf"))
  for _ in range(repeats):  # interleaved: a drift of the machine hits all three
    for name, loop in loops.items():
      start = time.perf_counter()
      loop().numpy()
      best[name] = min(best[name], time.perf_counter() - start)
  return {name: (best[name] - best["alone"]) / calls * 1e6 for name in ("keras", "per_example")}


def _spread(values: list[float]) -> str:
  return f"{statistics.median(values):,.0f} ({min(values):,.0f}-{max(values):,.0f})"


def main(argv):
  del argv
  if _STEPS.value < 3 * _STEPS_PER_LOOP.value:
    raise app.UsageError("--steps: at least 3 loops (the first, tracing one is left out)")
  print(f"The seed CNN has no Dropout: every run trains benchmarks/dropout_cnn.py, the seed "
        f"CNN plus Dropout({_DROPOUT_RATE.value}) after its hidden dense layer "
        f"({_DENSE_UNITS} units). runtime.deterministic=true, synthetic data, global batch "
        f"{_BATCH.value}, {_STEPS.value} steps, {_STEPS_PER_LOOP.value} per loop; "
        f"{_ROUNDS.value} alternating rounds; load average at the start "
        f"{os.getloadavg()[0]:.1f} ({os.cpu_count()} cores).", flush=True)
  rows, medians = [], {}
  for replicas in map(int, _REPLICAS.value):
    runs = {"on": [], "off": []}
    for round_ in range(_ROUNDS.value):
      for mode in ("on", "off") if round_ % 2 == 0 else ("off", "on"):
        runs[mode].append(_run(mode, replicas))
      print(f"  {replicas} replica(s), round {round_ + 1}: on "
            f"{runs['on'][-1]['examples_per_sec']:,.0f} / off "
            f"{runs['off'][-1]['examples_per_sec']:,.0f} ex/s", file=sys.stderr, flush=True)
    on = [run["examples_per_sec"] for run in runs["on"]]
    off = [run["examples_per_sec"] for run in runs["off"]]
    ratios = [a / b for a, b in zip(on, off)]
    steady = [run["steady_seconds"] for mode in runs for run in runs[mode]]
    mask = _BATCH.value // replicas * _DENSE_UNITS  # a replica's own share of the mask
    medians[replicas] = statistics.median(on)
    rows.append(f"| {replicas} | {mask * replicas:,} / {mask:,} | {_spread(on)} | "
                f"{_spread(off)} | {statistics.median(on) / statistics.median(off):.3f}x "
                f"(median paired {statistics.median(ratios):.3f}x, {min(ratios):.3f}-"
                f"{max(ratios):.3f}) | {min(steady):.1f}-{max(steady):.1f} |")
  print(f"load average at the end {os.getloadavg()[0]:.1f}\n")
  print("| replicas | uniform numbers a replica draws per step, on / off | on: ex/s, median "
        "(range) | off: ex/s, median (range) | on / off (paired) | steady window, s |")
  print("| ---: | ---: | ---: | ---: | ---: | ---: |")
  print("\n".join(rows))
  if not _DRAW_COST.value:
    return
  print("\nOne replica's Dropout mask alone, forward, one thread per op (microseconds a step; "
        "the step: the global batch over the median rate on, the replicas side by side):\n")
  print("| replicas | Keras's dropout over the replica's rows | per example: the global batch's "
        "draw, the replica's rows | difference | a step | difference / step |")
  print("| ---: | ---: | ---: | ---: | ---: | ---: |")
  for replicas, rate in medians.items():
    cost = _draw_microseconds(replicas)
    step = _BATCH.value / rate * 1e6
    extra = cost["per_example"] - cost["keras"]
    print(f"| {replicas} | {cost['keras']:.1f} | {cost['per_example']:.1f} | {extra:+.1f} | "
          f"{step:,.0f} | {extra / step:+.2%} |")


if __name__ == "__main__":
  app.run(main)
