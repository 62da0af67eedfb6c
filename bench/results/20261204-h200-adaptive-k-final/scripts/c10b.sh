# call 2 (right after c10a.sh, same machine): GGUF part 2, assemble, convert; issue 20: the full adaptive-k sweep
# (1-256 prompts) on GSM8K test with the final policy (standing decisions that double), medians of 7
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /root/site .whl/gguf*.whl || exit 1
export PYTHONPATH=/root/site:.
mkdir -p weights/.cache/smollm2-135m-instruct /root/data /root/m
cp .gpu/p2/m.xz.1 /root/w/
cat /root/w/m.xz.0 /root/w/m.xz.1 | xz -d -T8 > weights/.cache/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf
python3 -m jaxspec fetch 2>&1 | tail -1
echo "converted t=$SECONDS"
xz -dc .gpu/data/gsm8k_test.jsonl.xz > /root/data/gsm8k_test.jsonl
cp .gpu/data/held_out.jsonl /root/data/held_out.jsonl
HEAD='{"method": "eagle", "model": "weights/eagle-smollm2-135m-instruct", "num_speculative_tokens": 3}'
for d in gsm8k_test; do
  echo "=== [t=$SECONDS] $d"
  timeout $((575 - SECONDS)) python3 bench/throughput.py --model weights/smollm2-135m-instruct --speculative-config "$HEAD" \
    --dataset-path /root/data/$d.jsonl --max-tokens 256 --ignore-eos --sweep --sweep-k --sweep-prompts 1,8,24,48,96,128,256 \
    --decode-buckets 1,8,24,48,96,128,256 --prefill-buckets 2048 --max-num-seqs 256 --layer-loop scan --repeats 7 \
    --results-dir /root/m --output-json /root/m/sweep-$d.json > /root/m/sweep-$d.log 2>&1
  echo "rc $? t=$SECONDS"
  cp /root/m/sweep-$d.json /root/m/sweep-$d.log $OUT/
done
python3 .gpu/ratios.py /root/m/sweep-*.json
echo "done t=$SECONDS"
