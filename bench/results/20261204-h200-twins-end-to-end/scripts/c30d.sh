# call 4 (right after c30c.sh): issue 20, the adaptive-k sweep on the GSM8K test prompts with twin programs, medians of 7
# (1-256 prompts) with the final policy, medians of 7
set -u
export PYTHONUNBUFFERED=1
export PYTHONPATH=/root/site:.
mkdir -p /root/m
HEAD='{"method": "eagle", "model": "weights/eagle-smollm2-135m-instruct", "num_speculative_tokens": 3}'
for d in gsm8k_test; do
  echo "=== [t=$SECONDS] $d"
  timeout $((570 - SECONDS)) python3 bench/throughput.py --model weights/smollm2-135m-instruct --speculative-config "$HEAD" \
    --dataset-path /root/data/$d.jsonl --max-tokens 256 --ignore-eos --sweep --sweep-k --sweep-prompts 1,8,24,48,96,128,256 \
    --decode-buckets 1,8,24,48,96,128,256 --prefill-buckets 2048 --max-num-seqs 256 --layer-loop scan --repeats 7 \
    --results-dir /root/m --output-json /root/m/sweep-$d.json > /root/m/sweep-$d.log 2>&1
  echo "rc $? t=$SECONDS"
  cp /root/m/sweep-$d.json /root/m/sweep-$d.log $OUT/
done
python3 .gpu/ratios.py /root/m/sweep-gsm8k_test.json
echo "done t=$SECONDS"
