# call 3 (right after c2.sh, same machine): issue 20, the held-out half of c3.sh (SmolLM2 + the shipped EAGLE-1 head, K = 3,
# EOS ignored, --repeats 7) after the dynamic policy's numpy was made cheaper (take, one table of counts per k)
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=/root/site:.
mkdir -p /root/data /root/m
cp .gpu/data/held_out.jsonl /root/data/held_out.jsonl
HEAD='{"method": "eagle", "model": "weights/eagle-smollm2-135m-instruct", "num_speculative_tokens": 3}'
for d in held_out; do
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
