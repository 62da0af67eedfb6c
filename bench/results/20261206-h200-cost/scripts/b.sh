# call 2 (right after a.sh): GGUF part 2, assemble, convert; issue 17's cost command (greedy vs logprobs=5 +
# presence_penalty=0.5 in one process, EOS ignored); then the structured-output cost (a regex that allows every text)
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /root/site .whl/*.whl || exit 1
mkdir -p weights/.cache/smollm2-135m-instruct /root/m $OUT
cat /root/w/gg.00 .gpu/p2/gg.01 > weights/.cache/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf || exit 1
PYTHONPATH=/root/site:. python3 -m jaxspec fetch 2>&1 | tail -1
echo "converted t=$SECONDS"
HEAD='{"method": "eagle", "model": "weights/eagle-smollm2-135m-instruct", "num_speculative_tokens": 3}'
B="python3 bench/throughput.py --model weights/smollm2-135m-instruct --dataset-path $PWD/.gpu/data/gsm8k_test.jsonl --max-tokens 1024 --max-num-seqs 96 --prefill-buckets 2048 --compilation-cache-dir /root/xla --no-enable-prefix-caching"
cost() { n=$1; lim=$2; shift 2; echo "=== [t=$SECONDS] $n: $*"
  PYTHONPATH=/root/site:. timeout $((lim - SECONDS)) $B --speculative-config "$HEAD" --num-prompts 96 --decode-buckets 96 \
    --ignore-eos --results-dir /root/m --output-json /root/m/$n.json "$@" > /root/m/$n.log 2>&1
  echo "rc $? t=$SECONDS"; cp /root/m/$n.json /root/m/$n.log $OUT/ 2>/dev/null; python3 .gpu/cost.py /root/m/$n.json; }
cost cost1 380 --repeats 5 --sweep-sampling '{"logprobs": 5, "presence_penalty": 0.5}'
cost so1 585 --repeats 3 --sweep-sampling '{"structured_outputs": {"regex": "(.|\\n)*"}}'
echo "done t=$SECONDS"
