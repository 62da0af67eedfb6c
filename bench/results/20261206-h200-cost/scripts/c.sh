# call 3 (warm, right after b.sh): issue 17's cost command again (a second process), the structured-output cost again
set -u
export PYTHONUNBUFFERED=1
ls weights/smollm2-135m-instruct/ckpt >/dev/null || exit 1
HEAD='{"method": "eagle", "model": "weights/eagle-smollm2-135m-instruct", "num_speculative_tokens": 3}'
B="python3 bench/throughput.py --model weights/smollm2-135m-instruct --dataset-path $PWD/.gpu/data/gsm8k_test.jsonl --max-tokens 1024 --max-num-seqs 96 --prefill-buckets 2048 --compilation-cache-dir /root/xla --no-enable-prefix-caching"
cost() { n=$1; lim=$2; shift 2; echo "=== [t=$SECONDS] $n: $*"
  PYTHONPATH=/root/site:. timeout $((lim - SECONDS)) $B --speculative-config "$HEAD" --num-prompts 96 --decode-buckets 96 \
    --ignore-eos --results-dir /root/m --output-json /root/m/$n.json "$@" > /root/m/$n.log 2>&1
  echo "rc $? t=$SECONDS"; cp /root/m/$n.json /root/m/$n.log $OUT/ 2>/dev/null; python3 .gpu/cost.py /root/m/$n.json; }
cost cost2 300 --repeats 5 --sweep-sampling '{"logprobs": 5, "presence_penalty": 0.5}'
cost so2 585 --repeats 3 --sweep-sampling '{"structured_outputs": {"regex": "(.|\\n)*"}}'
echo "done t=$SECONDS"
