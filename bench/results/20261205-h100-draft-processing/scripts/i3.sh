# call 3 (warm): end to end with repetition_penalty=1.2 (EOS ignored, 256 tokens... 1024), this tree then d257358
set -u
export PYTHONUNBUFFERED=1
ls weights/smollm2-135m-instruct/ckpt >/dev/null || exit 1
HEAD='{"method": "eagle", "model": "weights/eagle-smollm2-135m-instruct", "num_speculative_tokens": 3}'
B="python3 bench/throughput.py --model weights/smollm2-135m-instruct --dataset-path $PWD/.gpu/data/gsm8k_test.jsonl --max-tokens 1024 --max-num-seqs 96 --prefill-buckets 2048 --compilation-cache-dir /root/xla --no-enable-prefix-caching"
for t in $PWD /root/old; do
  n=$(basename $t)
  echo "=== [t=$SECONDS] repetition $t"
  (cd $t && PYTHONPATH=/root/site:. timeout $((280 - SECONDS)) $B --speculative-config "$HEAD" --num-prompts 96 --decode-buckets 96 \
    --repeats 5 --ignore-eos --sweep-sampling '{"repetition_penalty": 1.2}' --results-dir /root/m \
    --output-json /root/m/rep-$n.json > /root/m/rep-$n.log 2>&1)
  echo "rc $? t=$SECONDS"
  cp /root/m/rep-$n.json $OUT/ 2>/dev/null
  python3 .gpu/cost.py  # = ../../20261205-h100-cost-sweep/scripts/cost.py /root/m/rep-$n.json
done
echo "done t=$SECONDS"
