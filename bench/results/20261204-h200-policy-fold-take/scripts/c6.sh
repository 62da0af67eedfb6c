# call 4 (right after c5.sh, same machine): issue 20, the GSM8K half of c3.sh with the same code as c5.sh
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=/root/site:.
mkdir -p /root/data /root/m
[ -f /root/data/gsm8k_test.jsonl ] || xz -dc .gpu/data/gsm8k_test.jsonl.xz > /root/data/gsm8k_test.jsonl
HEAD='{"method": "eagle", "model": "weights/eagle-smollm2-135m-instruct", "num_speculative_tokens": 3}'
for d in gsm8k_test; do
  echo "=== [t=$SECONDS] $d"
  timeout $((560 - SECONDS)) python3 bench/throughput.py --model weights/smollm2-135m-instruct --speculative-config "$HEAD" \
    --dataset-path /root/data/$d.jsonl --max-tokens 256 --ignore-eos --sweep --sweep-k --sweep-prompts 1,8,24,48,96,128,256 \
    --decode-buckets 1,8,24,48,96,128,256 --prefill-buckets 2048 --max-num-seqs 256 --layer-loop scan --repeats 7 \
    --results-dir /root/m --output-json /root/m/sweep-$d.json > /root/m/sweep-$d.log 2>&1
  echo "rc $? t=$SECONDS"; grep -E "^\[bench" /root/m/sweep-$d.log | head -2 | cut -c1-160
  cp /root/m/sweep-$d.json /root/m/sweep-$d.log $OUT/
done
python3 .gpu/ratios.py /root/m/sweep-*.json
echo "done t=$SECONDS"
