# call 3 (warm, right after h2.sh): the cost command again, this tree, d257358, this tree (one process each)
set -u
export PYTHONUNBUFFERED=1
ls weights/smollm2-135m-instruct/ckpt >/dev/null || exit 1
HEAD='{"method": "eagle", "model": "weights/eagle-smollm2-135m-instruct", "num_speculative_tokens": 3}'
B="python3 bench/throughput.py --model weights/smollm2-135m-instruct --dataset-path $PWD/.gpu/data/gsm8k_test.jsonl --max-tokens 1024 --max-num-seqs 96 --prefill-buckets 2048 --compilation-cache-dir /root/xla --no-enable-prefix-caching"
i=0
for t in $PWD /root/old $PWD; do
  i=$((i+1)); n=$(basename $t)-$i
  echo "=== [t=$SECONDS] cost $t"
  (cd $t && PYTHONPATH=/root/site:. timeout $((560 - SECONDS)) $B --speculative-config "$HEAD" --num-prompts 96 --decode-buckets 96 \
    --repeats 5 --ignore-eos --sweep-sampling '{"logprobs": 5, "presence_penalty": 0.5}' --results-dir /root/m \
    --output-json /root/m/cost-$n.json > /root/m/cost-$n.log 2>&1)
  echo "rc $? t=$SECONDS"
  cp /root/m/cost-$n.json $OUT/ 2>/dev/null
  python3 .gpu/cost.py  # = ../../20261205-h100-cost-sweep/scripts/cost.py /root/m/cost-$n.json
done
echo "done t=$SECONDS"
