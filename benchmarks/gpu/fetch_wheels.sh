# Where PyPI is reachable, from the project root: the wheels benchmarks/gpu/prepare_device.sh
# installs on the GPU machine (git-ignored; carry benchmarks/gpu/wheels with the last chunk).
set -eu
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_17_x86_64 -d benchmarks/gpu/wheels \
  "tf-models-official<2.22" "tf-keras==2.21.*" "orbax-checkpoint==0.12.8"
ls benchmarks/gpu/wheels
