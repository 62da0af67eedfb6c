# Ran on this session's tree with the persistent layer applied: git apply scripts/persistent_layer.patch, cp scripts/grid_sync.py
# jaxspec/models/, cp scripts/test_grid_sync.py tests/ (not landed: see README.md).
# call 4: kernel time of one batch-1 step (random SmolLM2 weights, k = 0), five kernels a layer against the
# persistent layer (JAXSPEC_PERSISTENT_LAYER=1, its MLP weights loaded before the barriers), one process each
set -u
export PYTHONUNBUFFERED=1
mkdir -p $OUT/r
for v in 0 1; do
  echo "=== [t=$SECONDS] persistent=$v"
  JAXSPEC_PERSISTENT_LAYER=$v PYTHONPATH=. timeout 150 python3 bench/step_time.py --hf-config smollm2-135m --context 512 --iters 30 --batches 1 --k 0 --profile-dir /root/st-$v --output-json $OUT/r/step-$v.json > $OUT/r/step-$v.log 2>&1; echo "rc $?"
  grep -v Warn $OUT/r/step-$v.log | tail -22
done
cd $OUT && tar czf r.tgz r && rm -rf r
