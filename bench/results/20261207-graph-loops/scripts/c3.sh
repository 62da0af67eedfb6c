# call 3 (issue 19): multi_decode_step's device loop unrolled where the layers are (the GPU's default), so that
# XLA's GEMM fusions take each layer's weights whole as in single steps instead of copying them out of the
# stacked arrays at every step (call 2: 90 memcpy128 + 33 memcpy32_post a step, 0.26 ms). Random SmolLM2
# weights, EAGLE k = 3, one process each.
set -u
export PYTHONUNBUFFERED=1
mkdir -p $OUT/r
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u
E='{"num_speculative_tokens": 3}'
B1="--load-format dummy --hf-config smollm2-135m --dataset-name random --input-len 128 --num-prompts 1 --max-tokens 1024 --ignore-eos --decode-buckets 1 --prefill-buckets 128"
echo "=== [t=$SECONDS] step_time M=4 profile"
PYTHONPATH=. timeout 120 python3 bench/step_time.py --hf-config smollm2-135m --context 256 --iters 30 --batches 1 --k 3 --num-steps 4 --profile-dir /root/prof4 --output-json $OUT/r/prof-m4.json > $OUT/r/prof-m4.log 2>&1; echo "rc $?"
grep -v "^INFO\|^\[" $OUT/r/prof-m4.log | head -12; grep -v "^INFO\|^\[" $OUT/r/prof-m4.log | grep "step "
echo "=== [t=$SECONDS] step_time M=1"
PYTHONPATH=. timeout 60 python3 bench/step_time.py --hf-config smollm2-135m --context 256 --iters 30 --batches 1 --k 3 --output-json $OUT/r/step-m1.json > $OUT/r/step-m1.log 2>&1; echo "rc $?"
grep "step " $OUT/r/step-m1.log | grep -v "^\["
for m in 4 1; do
  echo "=== [t=$SECONDS] eagle b1 M=$m"
  PYTHONPATH=. timeout 90 python3 bench/throughput.py $B1 --speculative-config "$E" --synthetic-acceptance 0.6 --num-scheduler-steps $m --output-json $OUT/r/eagle1-m$m.json > $OUT/r/eagle1-m$m.log 2>&1; echo "rc $?"
  grep -h "^Throughput\|ms/step wall\|compiled multi" $OUT/r/eagle1-m$m.log
done
echo "=== [t=$SECONDS] 96 prompts M=4"
PYTHONPATH=. timeout 90 python3 bench/throughput.py --load-format dummy --hf-config smollm2-135m --dataset-name random --input-len 128 --max-tokens 256 --prefill-buckets 2048 --num-prompts 96 --decode-buckets 96 --speculative-config "$E" --synthetic-acceptance 0.6 --num-scheduler-steps 4 --output-json $OUT/r/n96-m4.json > $OUT/r/n96-m4.log 2>&1; echo "rc $?"
grep -h "^Throughput\|ms/step wall\|compiled multi" $OUT/r/n96-m4.log
cd $OUT && tar czf r.tgz r && rm -rf r
echo "done t=$SECONDS"
