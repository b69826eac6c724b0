#!/bin/sh
# The orbit column's own environment: `sh benchmarks/orbit_env.sh [VENV_DIR]`.
#
# benchmarks.throughput compares distloop with TF Model Garden's orbit, which ships in
# the tf-models-official wheel and needs tf-keras. Neither is a distloop dependency, so
# they go into a venv of their own (default: ~/.cache/distloop-bench/orbit-venv, where
# benchmarks.throughput looks; another place: pass it here and --orbit_python to the
# benchmark). The venv sees this interpreter's packages (--system-site-packages), so
# orbit runs on the same TensorFlow as distloop. Installed without their dependencies:
# tf-models-official's would replace TensorFlow and bring a long tail orbit does not
# use (`import orbit` needs TensorFlow, absl and tf-keras only); tf-keras is pinned to
# TensorFlow's minor version, the pairing its releases follow.
set -eu

PYTHON="${PYTHON:-python}"
VENV="${1:-${XDG_CACHE_HOME:-$HOME/.cache}/distloop-bench/orbit-venv}"
# TensorFlow's major.minor, and the next minor: no Model Garden release newer than it.
set -- $("$PYTHON" -c 'import importlib.metadata as m
major, minor = m.version("tensorflow").split(".")[:2]
print(f"{major}.{minor} {major}.{int(minor) + 1}")')
TF_MINOR="$1"
TF_NEXT="$2"

"$PYTHON" -m venv --system-site-packages "$VENV"
"$VENV/bin/python" -m pip install --quiet --no-deps \
    "tf-models-official<$TF_NEXT" "tf-keras==$TF_MINOR.*"
if ! check="$(TF_CPP_MIN_LOG_LEVEL=3 TF_USE_LEGACY_KERAS=1 "$VENV/bin/python" -c '
import importlib.metadata as m
import orbit, tensorflow as tf, tf_keras
assert tf.keras.__name__.startswith("tf_keras"), tf.keras.__name__
models = m.version("tf-models-official")
print(f"tf-models-official {models} (orbit), tf-keras {tf_keras.__version__}, "
      f"TensorFlow {tf.__version__}")' 2>&1)"; then
  echo "$check" >&2
  echo "orbit_env.sh: error: orbit does not import in $VENV (above)" >&2
  exit 1
fi
echo "$check" | tail -n 1
echo "orbit's environment: $VENV/bin/python"
