# call 3 (issue 19): batch-1 EAGLE k = 3 kernel profiles, M = 4 (unrolled) against M = 1, with step_time counting
# steps rather than dispatches (both variants run ~43 steps a timing round, so their rows reach the same contexts;
# in calls 1 / 2 the 4-step run's rows grew four times as far); then the engine at batch 1 under cProfile, M = 1 and 4:
# where a 4-step dispatch's ~2.4 ms of host work goes. Random SmolLM2 weights, one process each.
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
B1="--load-format dummy --hf-config smollm2-135m --dataset-name random --input-len 128 --num-prompts 1 --max-tokens 1024 --ignore-eos --decode-buckets 1 --prefill-buckets 128"
for m in 1 4; do
  echo "=== [t=$SECONDS] engine b1 M=$m under cProfile"
  PYTHONPATH=. timeout 150 python3 -m cProfile -o $OUT/r/engine-m$m.prof bench/throughput.py $B1 --speculative-config '{"num_speculative_tokens": 3}' --synthetic-acceptance 0.6 --num-scheduler-steps $m --output-json $OUT/r/engine-m$m.json > $OUT/r/engine-m$m.log 2>&1; echo "rc $?"
  grep -h "^Throughput\|ms/step wall" $OUT/r/engine-m$m.log
  python3 bench/results/20261207-unrolled-steps/scripts/hostprof.py $OUT/r/engine-m$m.prof > $OUT/r/engine-m$m-prof.txt 2>&1
  head -45 $OUT/r/engine-m$m-prof.txt | tail -36
done
cd $OUT && tar czf r.tgz r && rm -rf r
echo "done t=$SECONDS"
