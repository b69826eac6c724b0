"""Length bucketing on and off: `python -m benchmarks.bucketing [--repeats=5]`.

The workload: token sequences of length 5..200 (tests/plugins/sequence_plugins.py),
`data.pad_to=32,64,128`, a masked-mean model and a GRU, global batch 64. Per
model, fresh `python -m trainer` processes alternate between
`data.bucket_window=0` (before: each batch padded to its longest, ~the data's
longest) and the default window (after), with throughput over the same
steady-state window as benchmarks.throughput (the first, tracing loop left
out). The padding fraction (padded tokens / real tokens) is the pipeline's own,
counted over the same batches the runs train on (no timing). Prints a Markdown
table: medians, ranges, paired ratios.
"""
import json
import statistics
import sys
import tempfile

from absl import app
from absl import flags

from benchmarks import throughput

_STEPS = flags.DEFINE_integer("bucket_steps", 300, "training steps per run")
_ONLY = flags.DEFINE_list("bucket_models", [], "model names to run (default: all)")
_BATCH = 64
_PAD_TO = "32,64,128"
_MODELS = {"masked mean": "tests.plugins.sequence_plugins:masked_mean",
           "GRU(8)": "tests.guarantees.workloads.variable_length_gru:embedding_gru"}


def _flags(model: str, window: int, steps: int) -> list[str]:
  return ["--config=synthetic", f"--config.model.name={model}",
          "--config.data.name=tests.plugins.sequence_plugins:numpy_sequences",
          "--config.data.num_train_examples=8192", "--config.data.num_eval_examples=64",
          f"--config.data.pad_to={_PAD_TO}", f"--config.data.bucket_window={window}",
          f"--config.train.global_batch_size={_BATCH}", f"--config.train.steps={steps}",
          "--config.train.steps_per_loop=50", f"--config.checkpoint.interval={steps}"]


def _examples_per_sec(model: str, window: int, steps: int) -> float:
  with tempfile.TemporaryDirectory(prefix="distloop_bucketing_") as model_dir:
    command = [sys.executable, "-m", "trainer", f"--model_dir={model_dir}",
               *_flags(model, window, steps)]
    _, stderr, code, _ = throughput.run_child(command, "onednn")
    if code != 0:
      raise throughput.failure(command, code, stderr)
    boundaries = throughput.loop_boundaries(stderr)
  (first_step, first_time), (last_step, last_time) = boundaries[0], boundaries[-1]
  return (last_step - first_step) * _BATCH / (last_time - first_time)


def _padding_fraction(window: int, steps: int) -> float:
  """Padded over real tokens of the first `steps` training batches, as the run reads them."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  from input_pipelines import batching, padding, sources  # pylint: disable=g-import-not-at-top
  from tests.plugins import sequence_plugins  # pylint: disable=g-import-not-at-top
  config = type("C", (dict,), {"__getattr__": dict.__getitem__})
  (x, y), _ = sequence_plugins.numpy_sequences(
      config(num_train_examples=8192, num_eval_examples=64), 0)
  pad = padding.from_config(config(pad_to=_PAD_TO, pad_value=0.0, bucket_window=window))
  source = sources.ArraySource(x, y, where="benchmark", padding=pad)
  padded = real = 0
  for features, _ in batching.train_dataset(source, seed=0, global_batch_size=_BATCH,
                                            start_example=0).take(steps):
    features = features.numpy()
    padded, real = padded + features.size, real + int(np.count_nonzero(features))
  return padded / real


def main(argv):
  del argv
  from configs import common  # pylint: disable=g-import-not-at-top
  window, steps = common.base_config().data.bucket_window, _STEPS.value
  repeats = throughput.REPEATS.value
  before_pad, after_pad = _padding_fraction(0, steps), _padding_fraction(window, steps)
  print(f"padded / real tokens over the {steps} batches: {before_pad:.2f} without bucketing, "
        f"{after_pad:.2f} with data.bucket_window={window}")
  print(f"{repeats} alternating rounds of fresh processes, {steps} steps, batch {_BATCH}")
  print("| model | before ex/s (range) | after ex/s (range) | after / before (paired range) |")
  print("|---|---|---|---|")
  for name, model in _MODELS.items():
    if _ONLY.value and name not in _ONLY.value:
      continue
    before, after = [], []
    for _ in range(repeats):
      before.append(_examples_per_sec(model, 0, steps))
      after.append(_examples_per_sec(model, window, steps))
    ratios = [a / b for a, b in zip(after, before)]
    print(f"| {name} | {statistics.median(before):.0f} ({min(before):.0f}-{max(before):.0f}) "
          f"| {statistics.median(after):.0f} ({min(after):.0f}-{max(after):.0f}) | "
          f"{statistics.median(after) / statistics.median(before):.2f}x "
          f"({min(ratios):.2f}-{max(ratios):.2f}) |", flush=True)
  print(json.dumps({"padding_before": before_pad, "padding_after": after_pad}), file=sys.stderr)


if __name__ == "__main__":
  app.run(main)
