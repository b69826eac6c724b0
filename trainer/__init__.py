"""distloop's trainer: a readable custom training loop on tf.distribute.

Run it with `python -m trainer --config=NAME --model_dir=DIR`; the flow is read
top to bottom in `trainer/loop/controller.py`.

Importing this package (before TensorFlow) turns on oneDNN's CPU kernels on
x86-64 unless TF_ENABLE_ONEDNN_OPTS is already set: TensorFlow enables them by
default only on CPUs with AVX-512 VNNI/BF16 or AMX, and on an AVX2 CPU they ran
the seed CNN's step 2x-4x faster than the Eigen kernels (docs/performance.md).
TensorFlow reads the variable once, when it loads: set TF_ENABLE_ONEDNN_OPTS=0
to keep the Eigen kernels, and set it yourself if you import TensorFlow first.
"""
import os as _os
import platform as _platform

if _platform.machine().lower() in ("x86_64", "amd64"):
  _os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")

# The public API, imported on first use (so that `python -m trainer` checks flags and
# config before TensorFlow loads): trainer.run (every mode), trainer.Task, trainer.Export,
# trainer.Action (and trainer.Stop), trainer.Reporter.
_API = {"Task": "trainer.task", "Export": "trainer.task", "BuildContext": "trainer.task",
        "StepContext": "trainer.task", "PredictContext": "trainer.task", "run": "trainer.api",
        "predict": "trainer.api", "Action": "trainer.loop.actions", "Stop": "trainer.loop.actions",
        "Boundary": "trainer.loop.actions", "Reporter": "trainer.reporters.contract"}


def __getattr__(name):
  if name in _API:
    import importlib  # pylint: disable=g-import-not-at-top
    from trainer.setup import module_names  # pylint: disable=g-import-not-at-top
    shadowed = module_names.shadowing()  # a user's models.py would break it far away
    if shadowed:
      raise ImportError(shadowed)
    return getattr(importlib.import_module(_API[name]), name)
  raise AttributeError(f"module 'trainer' has no attribute {name!r}")
