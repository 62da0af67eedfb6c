# call 3 (issue 19): batch-1 EAGLE k = 3 kernel profiles, M = 4 (unrolled) against M = 1, with step_time counting
# steps rather than dispatches (both variants run ~43 steps a timing round, so their rows reach the same contexts;
# in calls 1 / 2 the 4-step run's rows grew four times as far). Random SmolLM2 weights, one process each.
set -u
export PYTHONUNBUFFERED=1
mkdir -p $OUT/r
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u
i=0
for m in 1 4 1; do
  i=$((i + 1)); f=$OUT/r/prof-$i-m$m
  echo "=== [t=$SECONDS] step_time M=$m profile"
  PYTHONPATH=. timeout 100 python3 bench/step_time.py --hf-config smollm2-135m --context 256 --iters 32 --batches 1 --k 3 --num-steps $m --profile-dir /root/prof-$i --output-json $f.json > $f.log 2>&1; echo "rc $?"
  grep -v "^INFO\|^\[" $f.log | head -12; grep " step " $f.log | grep -v "^\["
done
cd $OUT && tar czf r.tgz r && rm -rf r
echo "done t=$SECONDS"
