# call 3: GGUF part 2, assemble, convert; the adaptive-k sweep (dynamic policy vs no speculation and fixed k = 0..3)
# with the shipped (2026-12-03) EAGLE-1 head on GSM8K test and on held-out general prompts (seed 0), medians of 3
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /root/site .whl/gguf*.whl || exit 1
export PYTHONPATH=/root/site:.
mkdir -p weights/.cache/smollm2-135m-instruct /root/data $OUT/m
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
  timeout $((590 - SECONDS)) python3 bench/throughput.py --model weights/smollm2-135m-instruct --speculative-config "$HEAD" \
    --dataset-path /root/data/$d.jsonl --max-tokens 256 --sweep --sweep-k --sweep-prompts 1,8,24,48,96,128,256 \
    --decode-buckets 1,8,24,48,96,128,256 --prefill-buckets 2048 --max-num-seqs 256 --layer-loop scan --repeats 3 \
    --results-dir $OUT/m --output-json $OUT/m/sweep-$d.json > $OUT/m/sweep-$d.log 2>&1
  echo "rc $?"; grep -E "^\| [0-9]+ \|" $OUT/m/sweep-$d.log | grep -E "dynamic|k=|no spec" | head -80 | cut -c1-90
done
ls -l $OUT/m; echo "done t=$SECONDS"
