# Alone on the GPU: distloop vs fit at its best and orbit, batch 32 and 256 (~4.5 min on an
# H100 with REPEATS=2). Writes $OUT/throughput.md.
python3 -m benchmarks.throughput --batches=32,256 --replicas=1 --repeats="${REPEATS:-2}" \
  --peers=fit,orbit --fit_settings=50:jit --nocheckpoint_cost --nopipeline \
  --orbit_python=/root/orbitpy --output="$OUT/throughput.md" 2>&1 | grep '^| '
