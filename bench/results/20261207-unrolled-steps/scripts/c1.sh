# call 1 (issue 19): multi_decode_step unrolled where the layers are (c587d01). Random SmolLM2 weights, EAGLE k = 3
# at synthetic p = 0.6, one process each: M = 4 kernel profile and step time against M = 1; batch 1 with M = 4 / 1;
# device busy with M = 4 at 1 / 24 / 64 / 96 prompts, the busy runs as long as the timed ones (256 tokens; 1,024 at
# one prompt).
set -u
export PYTHONUNBUFFERED=1
mkdir -p $OUT/r
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u
E='{"num_speculative_tokens": 3}'
B1="--load-format dummy --hf-config smollm2-135m --dataset-name random --input-len 128 --num-prompts 1 --max-tokens 1024 --ignore-eos --decode-buckets 1 --prefill-buckets 128"
echo "=== [t=$SECONDS] step_time M=4 profile"
PYTHONPATH=. timeout 120 python3 bench/step_time.py --hf-config smollm2-135m --context 256 --iters 30 --batches 1 --k 3 --num-steps 4 --profile-dir /root/prof4 --output-json $OUT/r/prof-m4.json > $OUT/r/prof-m4.log 2>&1; echo "rc $?"
grep -v "^INFO\|^\[" $OUT/r/prof-m4.log | head -14
echo "=== [t=$SECONDS] step_time M=1"
PYTHONPATH=. timeout 60 python3 bench/step_time.py --hf-config smollm2-135m --context 256 --iters 30 --batches 1 --k 3 --output-json $OUT/r/step-m1.json > $OUT/r/step-m1.log 2>&1; echo "rc $?"
grep "step " $OUT/r/step-m1.log | grep -v "^\["
for m in 4 1; do
  echo "=== [t=$SECONDS] eagle b1 M=$m"
  P=""; [ $m = 4 ] && P="--profile-dir /root/pb1"
  PYTHONPATH=. timeout 90 python3 bench/throughput.py $B1 --speculative-config "$E" --synthetic-acceptance 0.6 --num-scheduler-steps $m $P --output-json $OUT/r/eagle1-m$m.json > $OUT/r/eagle1-m$m.log 2>&1; echo "rc $?"
  grep -h "^Throughput\|ms/step wall\|compiled multi\|compiled decode\|| async\|| sync" $OUT/r/eagle1-m$m.log
done
for n in 24 64 96; do
  echo "=== [t=$SECONDS] $n prompts M=4, busy"
  PYTHONPATH=. timeout 100 python3 bench/throughput.py --load-format dummy --hf-config smollm2-135m --dataset-name random --input-len 128 --max-tokens 256 --prefill-buckets 2048 --num-prompts $n --decode-buckets $n --speculative-config "$E" --synthetic-acceptance 0.6 --num-scheduler-steps 4 --profile-dir /root/p$n --profile-prompts $n --output-json $OUT/r/n$n-m4.json > $OUT/r/n$n-m4.log 2>&1; echo "rc $?"
  grep -h "^Throughput\|ms/step wall\|| async\|| sync" $OUT/r/n$n-m4.log
done
cd $OUT && tar czf r.tgz r && rm -rf r
echo "done t=$SECONDS"
