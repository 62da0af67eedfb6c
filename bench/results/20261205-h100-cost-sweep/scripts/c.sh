# call C (right after b.sh): issue 20, the adaptive-k sweep on the held-out general prompts, 1-256 prompts, medians of 5
set -u
export PYTHONUNBUFFERED=1
export PYTHONPATH=/root/site:.
mkdir -p /root/m
HEAD='{"method": "eagle", "model": "weights/eagle-smollm2-135m-instruct", "num_speculative_tokens": 3}'
d=held_out
echo "=== [t=$SECONDS] $d"
timeout $((560 - SECONDS)) python3 bench/throughput.py --model weights/smollm2-135m-instruct --speculative-config "$HEAD" \
  --dataset-path .gpu/data/$d.jsonl --max-tokens 256 --ignore-eos --sweep --sweep-k --sweep-prompts 1,8,24,48,96,128,256 \
  --decode-buckets 1,8,24,48,96,128,256 --prefill-buckets 2048 --max-num-seqs 256 --layer-loop scan --repeats 5 --no-enable-prefix-caching \
  --compilation-cache-dir /root/xla --results-dir /root/m --output-json /root/m/sweep-$d.json > /root/m/sweep-$d.log 2>&1
echo "rc $? t=$SECONDS"
cp /root/m/sweep-$d.json /root/m/sweep-$d.log $OUT/
# .gpu/ratios.py: ../../20261204-h200-twins-end-to-end/scripts/ratios.py
python3 .gpu/ratios.py /root/m/sweep-$d.json
echo "done t=$SECONDS"
