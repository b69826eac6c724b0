# On the GPU machine, from the project root, after ../shared/gpu's chunks are unpacked
# (.gpuNN/setup.sh): orbit and tf-keras for the orbit column (benchmarks/gpu/wheels holds
# tf_keras-*.whl, tf_models_official-*.whl and orbax_checkpoint-*.whl, fetched where PyPI is
# reachable), CI's orbax over the image's, and /root/orbitpy, the interpreter the orbit
# column runs under. Source it: it exports PYTHONPATH.
python3 -m pip install -q --no-index --no-deps --no-compile --target /root/orbit \
    benchmarks/gpu/wheels/tf_keras-*.whl benchmarks/gpu/wheels/tf_models_official-*.whl
python3 -m pip install -q --no-index --no-deps --no-compile --target /root/orbax \
    benchmarks/gpu/wheels/orbax_checkpoint-*.whl
source "$(ls -d .gpu[0-9][0-9] | tail -n 1)/env.sh"
export PYTHONPATH=/root/orbax:$PYTHONPATH
printf '#!/bin/sh\nPYTHONPATH=/root/orbit:$PYTHONPATH exec python3 "$@"\n' > /root/orbitpy
chmod +x /root/orbitpy
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
