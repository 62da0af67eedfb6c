# call 5 (issue 19's busy criterion): as call 3 (random SmolLM2 weights, EAGLE k = 3 at synthetic acceptance 0.6,
# max_tokens 256, async, --profile-dir), one scheduler step a dispatch (M = 1) against four (M = 4), at 1, 24, 64
# and 96 prompts, one process each, M = 1 first at each count (24 and 96 only: the device time left).
set -u
export PYTHONUNBUFFERED=1
mkdir -p $OUT/r
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u

E='{"num_speculative_tokens": 3}'
for n in 24 96; do
  for m in 1 4; do
    echo "=== [t=$SECONDS] n=$n M=$m"
    PYTHONPATH=. timeout 130 python3 bench/throughput.py --load-format dummy --hf-config smollm2-135m --dataset-name random --input-len 128 --max-tokens 256 --prefill-buckets 2048 --num-prompts $n --decode-buckets $n --speculative-config "$E" --synthetic-acceptance 0.6 --num-scheduler-steps $m --profile-dir /root/prof-$n-$m --profile-prompts $n --output-json $OUT/r/busy-$n-m$m.json > $OUT/r/busy-$n-m$m.log 2>&1; echo "rc $?"
    grep "| async |" $OUT/r/busy-$n-m$m.log; grep "^| $n | eagle" $OUT/r/busy-$n-m$m.log
  done
done
cd $OUT && tar czf r.tgz r && rm -rf r
echo "done t=$SECONDS"
