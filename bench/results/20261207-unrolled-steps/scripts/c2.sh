# call 2 (issue 19), right after call 1 on the same machine: SmolLM2 batch-1 profile with M = 1; then Llama-3-8B shapes (random weights), plain decode step per step with M = 4 (unrolled) against
# M = 1 at batch 1 and 32, context 512. One process each.
set -u
export PYTHONUNBUFFERED=1
mkdir -p $OUT/r
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u
echo "=== [t=$SECONDS] SmolLM2 step_time M=1 profile (call 1's M = 4 profile, same machine)"
PYTHONPATH=. timeout 90 python3 bench/step_time.py --hf-config smollm2-135m --context 256 --iters 30 --batches 1 --k 3 --profile-dir /root/prof1 --output-json $OUT/r/prof-m1.json > $OUT/r/prof-m1.log 2>&1; echo "rc $?"
grep -v "^INFO\|^\[" $OUT/r/prof-m1.log | head -14
for m in 1 4; do
  echo "=== [t=$SECONDS] 8B plain M=$m"
  PYTHONPATH=. timeout 190 python3 bench/step_time.py --hf-config llama-3-8b --context 512 --iters 20 --batches 1,32 --num-steps $m --output-json $OUT/r/8b-m$m.json > $OUT/r/8b-m$m.log 2>&1; echo "rc $?"
  grep -v "^INFO\|^\[" $OUT/r/8b-m$m.log | tail -8
done
cd $OUT && tar czf r.tgz r && rm -rf r
echo "done t=$SECONDS"
