# call 2: GGUF part 2 -> the target (kept in /root/w/target); the seed-7 mix and data to /root/w; then, with BENCH=1,
# (a) the step before and after the n-gram change: a587b4c (.gpu/old) vs this tree, random weights, synthetic
#     acceptance 0.6, k = 3, 96 prompts, 256 tokens, scanned layers, one process each, old/new/old/new;
# (b) n-gram (min 2, max 5, k = 3) vs no speculation, GSM8K test, 1 / 24 / 96 prompts, async and sync
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /root/site .gpu/whl1/*.whl || exit 1
export PYTHONPATH=/root/site:.
mkdir -p weights/.cache/smollm2-135m-instruct /root/w/data /root/w/logs $OUT
cat /root/w/gg.00 .gpu/p2/gg.01 > weights/.cache/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf || exit 1
python3 -m jaxspec fetch 2>&1 | tail -1
cp -r weights/smollm2-135m-instruct /root/w/target
cp .gpu/keep/mix-seed7.npz /root/w/
for f in .gpu/data2/*.xz .gpu/data3/*.xz; do xz -dc $f > /root/w/data/$(basename $f .xz); done; wc -l /root/w/data/*
echo '{"num_speculative_tokens": 3}' > /root/w/k3.json
[ "${BENCH:-0}" = 1 ] || exit 0
echo "=== [t=$SECONDS] A/B"
for r in $(seq 1 ${ROUNDS:-2}); do for v in old new; do
  d=$PWD; [ $v = old ] && d=$PWD/.gpu/old
  (cd $d && PYTHONPATH=/root/site:. timeout ${AB_S:-170} python3 bench/throughput.py --load-format dummy --hf-config smollm2-135m \
    --dataset-name random --input-len 128 --num-prompts 96 --max-tokens 256 --speculative-config /root/w/k3.json \
    --synthetic-acceptance 0.6 --decode-buckets 96 --prefill-buckets 2048 --layer-loop scan --repeats 3 \
    --output-json $OUT/syn-$v-$r.json > /root/w/logs/syn-$v-$r.log 2>&1)
  echo "$v $r rc $? t=$SECONDS"
done; done
if [ "${NGRAM:-1}" = 1 ]; then
echo "=== [t=$SECONDS] ngram"
timeout $((560 - SECONDS)) python3 bench/throughput.py --model weights/smollm2-135m-instruct \
  --dataset-path /root/w/data/gsm8k_test.jsonl --max-tokens 256 \
  --speculative-config '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2, "prompt_lookup_max": 5}' \
  --sweep --sweep-prompts 1,24,96 --decode-buckets 1,24,96 --prefill-buckets 2048 --max-num-seqs 96 --layer-loop scan \
  --output-json $OUT/ngram-gsm8k.json > /root/w/logs/ngram.log 2>&1
echo "rc $? t=$SECONDS"
fi
tar czf $OUT/logs.tgz -C /root/w logs
python3 .gpu/s8/table.py $OUT/*.json
