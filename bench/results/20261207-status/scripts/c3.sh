# call 3 (issue 19's busy criterion): device busy in async mode (kernel timeline and NVML), random SmolLM2 weights,
# EAGLE k = 3 at synthetic acceptance 0.6, at 1, 24, 64 and 96 prompts, one process each, max_tokens 256.
set -u
export PYTHONUNBUFFERED=1
mkdir -p $OUT/r
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u
E='{"num_speculative_tokens": 3}'
for n in 1 24 64 96; do
  echo "=== [t=$SECONDS] $n"
  PYTHONPATH=. timeout 130 python3 bench/throughput.py --load-format dummy --hf-config smollm2-135m --dataset-name random --input-len 128 --max-tokens 256 --prefill-buckets 2048 --num-prompts $n --decode-buckets $n --speculative-config "$E" --synthetic-acceptance 0.6 --profile-dir /root/prof-$n --profile-prompts $n --output-json $OUT/r/busy-$n.json > $OUT/r/busy-$n.log 2>&1; echo "rc $?"
  grep -i -A12 "busy" $OUT/r/busy-$n.log | grep -v Warn | tail -14
done
cd $OUT && tar czf r.tgz r && rm -rf r
echo "done t=$SECONDS"
