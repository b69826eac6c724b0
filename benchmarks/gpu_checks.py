"""The guarantees, re-checked on an accelerator: `python -m benchmarks.gpu_checks`.

CPU tests cannot see what XLA on a GPU changes, so on a GPU machine this runs
the default config (runtime.jit_compile=auto: the whole step under XLA there)
and checks: SIGTERM mid-run -> exit 42 -> resume ends with the weights of an
uninterrupted run (runtime.deterministic=true); bfloat16 and float16 runs
train to the float32 accuracy. Prints one markdown table (and writes --output).
"""
import json
import os
import signal
import subprocess
import sys
import tempfile

from absl import app
from absl import flags
import numpy as np

from trainer.verify.processes import read_checkpoint

_OUTPUT = flags.DEFINE_string("output", "", "also write the report to this file")
_STEPS = 600
_STOP_AT = "step 200/"


def _command(model_dir: str, *flags_: str) -> list[str]:
  return [sys.executable, "-m", "trainer", "--config=synthetic", f"--model_dir={model_dir}",
          f"--config.train.steps={_STEPS}", "--config.train.steps_per_loop=50",
          "--config.runtime.deterministic=true", *flags_]


def _train(model_dir: str, *flags_: str) -> dict:
  completed = subprocess.run(_command(model_dir, *flags_), capture_output=True, text=True)
  if completed.returncode != 0:
    raise SystemExit(f"exit {completed.returncode}:\n{completed.stderr[-3000:]}")
  with open(os.path.join(model_dir, "summary.json")) as f:
    return json.load(f)


def _preempt_and_resume(model_dir: str) -> int:
  """SIGTERM once the log says step 200; returns the exit code; then runs to the end."""
  process = subprocess.Popen(_command(model_dir), stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
  for line in process.stdout:
    if _STOP_AT in line:
      process.send_signal(signal.SIGTERM)
      break
  process.stdout.read()
  code = process.wait()
  _train(model_dir)
  return code


def main(argv):
  del argv
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  rows = []
  with tempfile.TemporaryDirectory() as root:
    straight = _train(os.path.join(root, "straight"))
    rows.append(("float32, uninterrupted", straight))
    code = _preempt_and_resume(os.path.join(root, "resumed"))
    a, b = (read_checkpoint(os.path.join(root, run), _STEPS, items=("model",))
            for run in ("straight", "resumed"))
    difference = max(float(np.abs(a[k] - b[k]).max()) for k in a)
    for precision in ("bfloat16", "float16"):
      rows.append((precision, _train(os.path.join(root, precision),
                                     f"--config.runtime.mixed_precision={precision}")))
  lines = ["| run | eval accuracy | examples/s |", "| --- | ---: | ---: |"]
  lines += [f"| {name} | {s['eval_accuracy']:.4f} | {s['examples_per_sec']:.0f} |"
            for name, s in rows]
  lines += ["", f"SIGTERM at {_STOP_AT.strip('/')}: exit {code}; resumed to step {_STEPS}: "
            f"largest weight difference from the uninterrupted run {difference:.3g} "
            f"({'exact' if difference <= 1e-6 else 'NOT exact'})"]
  report = "\n".join(lines)
  print(report)
  if _OUTPUT.value:
    with open(_OUTPUT.value, "w") as f:
      f.write(report + "\n")


if __name__ == "__main__":
  app.run(main)
