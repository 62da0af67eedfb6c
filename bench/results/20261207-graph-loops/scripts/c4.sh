# call 4 (issue 19, the device time left for this session): call 3's first and third runs alone (the unrolled
# 4-step dispatch: device time a step by kernel; the engine at batch 1 with EAGLE k = 3).
set -u
export PYTHONUNBUFFERED=1
mkdir -p $OUT/r
nvidia-smi --query-gpu=name --format=csv,noheader
E='{"num_speculative_tokens": 3}'
echo "=== [t=$SECONDS] step_time M=4 profile"
PYTHONPATH=. timeout 70 python3 bench/step_time.py --hf-config smollm2-135m --context 256 --iters 30 --batches 1 --k 3 --num-steps 4 --profile-dir /root/prof4 --output-json $OUT/r/prof-m4.json > $OUT/r/prof-m4.log 2>&1; echo "rc $?"
grep -v "^INFO\|^\[" $OUT/r/prof-m4.log | head -8; grep -v "^INFO\|^\[" $OUT/r/prof-m4.log | grep "step "
echo "=== [t=$SECONDS] eagle b1 M=4"
PYTHONPATH=. timeout 50 python3 bench/throughput.py --load-format dummy --hf-config smollm2-135m --dataset-name random --input-len 128 --num-prompts 1 --max-tokens 1024 --ignore-eos --decode-buckets 1 --prefill-buckets 128 --speculative-config "$E" --synthetic-acceptance 0.6 --num-scheduler-steps 4 --output-json $OUT/r/eagle1-m4.json > $OUT/r/eagle1-m4.log 2>&1; echo "rc $?"
grep -h "^Throughput\|ms/step wall\|compiled multi" $OUT/r/eagle1-m4.log
cd $OUT && tar czf r.tgz r && rm -rf r
echo "done t=$SECONDS"
