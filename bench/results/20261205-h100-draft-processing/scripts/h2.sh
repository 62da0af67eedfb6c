# call 2 (right after h1.sh): GGUF part 2, assemble, convert; issue 17's cost command (greedy vs logprobs=5 +
# presence_penalty=0.5 in one process, EOS ignored) for this tree, then for d257358 (drafts from raw logits)
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /root/site .whl/gguf*.whl || exit 1
mkdir -p weights/.cache/smollm2-135m-instruct /root/m $OUT
cat /root/w/gg.00 .gpu/p2/gg.01 > weights/.cache/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf || exit 1
PYTHONPATH=/root/site:. python3 -m jaxspec fetch 2>&1 | tail -1
echo "converted t=$SECONDS"
[ -d /root/old ] || { mkdir /root/old && tar -xf .gpu/old.tar -C /root/old; }
rm -rf /root/old/weights && ln -sfn $PWD/weights /root/old/weights
HEAD='{"method": "eagle", "model": "weights/eagle-smollm2-135m-instruct", "num_speculative_tokens": 3}'
B="python3 bench/throughput.py --model weights/smollm2-135m-instruct --dataset-path $PWD/.gpu/data/gsm8k_test.jsonl --max-tokens 1024 --max-num-seqs 96 --prefill-buckets 2048 --compilation-cache-dir /root/xla --no-enable-prefix-caching"
for t in $PWD /root/old; do
  n=$(basename $t); LIM=590; [ "$t" = "$PWD" ] && LIM=335
  echo "=== [t=$SECONDS] cost $t"
  (cd $t && PYTHONPATH=/root/site:. timeout $((LIM - SECONDS)) $B --speculative-config "$HEAD" --num-prompts 96 --decode-buckets 96 \
    --repeats 5 --ignore-eos --sweep-sampling '{"logprobs": 5, "presence_penalty": 0.5}' --results-dir /root/m \
    --output-json /root/m/cost-$n.json > /root/m/cost-$n.log 2>&1)
  echo "rc $? t=$SECONDS"
  cp /root/m/cost-$n.json /root/m/cost-$n.log $OUT/ 2>/dev/null
  python3 .gpu/cost.py  # = ../../20261205-h100-cost-sweep/scripts/cost.py /root/m/cost-$n.json
done
echo "done t=$SECONDS"
