# call R4 (right after r2.sh): the preset's head (EAGLE-3, K = 3) onto the machine; batch 1 as in r2.sh with it; then
# issue 20's sweep, held-out general prompts, 1-256 prompts, no speculation / fixed k = 0..3 / dynamic, max_tokens
# 256, EOS ignored, medians of 3
set -u
export PYTHONUNBUFFERED=1
export PYTHONPATH=/root/site:.
mkdir -p /root/m $OUT/r && cp -r .gpu/p3/eagle3-smollm2-135m-instruct weights/ || exit 1
E3='{"method": "eagle3", "model": "weights/eagle3-smollm2-135m-instruct", "num_speculative_tokens": 3}'
timeout 120 python3 bench/throughput.py --model weights/smollm2-135m-instruct --dataset-path .gpu/data/gsm8k_test.jsonl \
  --num-prompts 1 --max-tokens 1024 --ignore-eos --decode-buckets 1 --prefill-buckets 512 --repeats 3 \
  --speculative-config "$E3" --compilation-cache-dir /root/xla --results-dir /root/m --output-json $OUT/r/eagle3-m1.json \
  > $OUT/r/eagle3-m1.log 2>&1
echo "eagle3-m1 rc $? t=$SECONDS: $(grep -o '[0-9.]* output tokens/s' $OUT/r/eagle3-m1.log | tr '\n' ' ')"
d=held_out
timeout $((590 - SECONDS)) python3 bench/throughput.py --model weights/smollm2-135m-instruct --speculative-config "$E3" \
  --dataset-path .gpu/data/$d.jsonl --max-tokens 256 --ignore-eos --sweep --sweep-k --sweep-prompts 1,8,24,48,96,128,256 \
  --decode-buckets 1,8,24,48,96,128,256 --prefill-buckets 2048 --max-num-seqs 256 --layer-loop scan --repeats 3 \
  --compilation-cache-dir /root/xla --results-dir /root/m --output-json $OUT/sweep-$d.json > $OUT/sweep-$d.log 2>&1
echo "rc $? t=$SECONDS"
sed -n "/Dynamic k against/,/^$/p" $OUT/sweep-$d.log
echo "done t=$SECONDS"
