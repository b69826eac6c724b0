"""distloop's trainer: a readable custom training loop on tf.distribute.

Run it with `python -m trainer --config=NAME --model_dir=DIR`; the flow is read
top to bottom in `trainer/loop.py`.

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
