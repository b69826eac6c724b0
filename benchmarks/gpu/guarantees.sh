# The guarantees on the GPU, side by side (~1.5 min on an H100): exact SIGTERM resume and
# mixed precision (benchmarks.gpu_checks), every strategy with runtime.jit_compile=auto, and
# the one-line refusal of jit_compile=true where XLA cannot reach the variables. Memory growth
# is on: the processes share the GPU. Logs go to $OUT (at most 8 files come back).
export TF_FORCE_GPU_ALLOW_GROWTH=true
python3 -m benchmarks.gpu_checks --output="$OUT/gpu_checks.md" > /dev/null 2>&1 &
for s in default mirrored multi_worker_mirrored parameter_server; do
  python3 -m benchmarks.strategies --steps=300 --only=$s > "$OUT/strategy_$s.log" 2>&1 &
done
for s in one_device central_storage; do
  python3 -m trainer --config=synthetic --model_dir=/tmp/gpu_$s --config.train.steps=300 \
    --config.runtime.strategy=$s > "$OUT/strategy_$s.log" 2>&1 &
done
wait
cat "$OUT/gpu_checks.md"
grep -h '^| [a-z]' "$OUT"/strategy_*.log | grep -v '^| strategy'
grep -h -A2 'Done at\|error:' "$OUT"/strategy_*_device.log "$OUT"/strategy_central_storage.log
python3 -m trainer --config=synthetic --model_dir=/tmp/gpu_cs_jit --config.train.steps=10 \
  --config.runtime.strategy=central_storage --config.runtime.jit_compile=true 2>&1 | grep error:
