# call S5 (after s3.sh, on the same machine; carries the head and the data again): issue 20's sweep on GSM8K test
# prompts with the preset's head (EAGLE-3, K = 3): no speculation / fixed k = 0..3 / dynamic, max_tokens 256, EOS
# ignored, medians of 3, the step-time model in 5 interleaved rounds. Arguments: the seconds it may run, and
# "lookup" for prompt lookup (n-grams of 2-5) as the head's fallback
set -u
export PYTHONUNBUFFERED=1
export PYTHONPATH=/root/site:.
mkdir -p /root/m && cp -r .gpu/p3/eagle3-smollm2-135m-instruct weights/ || exit 1
D=${1:-590}
N=1,8,24,48,96,128,256
H='"method": "eagle3", "model": "weights/eagle3-smollm2-135m-instruct", "num_speculative_tokens": 3'
[ "${2:-}" = lookup ] && H="$H, \"prompt_lookup_min\": 2, \"prompt_lookup_max\": 5"
T=gsm8k${2:+-$2}
timeout $((D - SECONDS)) python3 bench/throughput.py --model weights/smollm2-135m-instruct \
  --speculative-config "{$H}" \
  --dataset-path .gpu/data/gsm8k_test.jsonl --max-tokens 256 --ignore-eos --sweep --sweep-k \
  --sweep-prompts $N --decode-buckets $N --prefill-buckets 2048 --max-num-seqs 256 --layer-loop scan --repeats 3 \
  --time-budget-s $((D - SECONDS - 25)) --compilation-cache-dir /root/xla --results-dir /root/m \
  --output-json $OUT/sweep-$T.json > $OUT/sweep-$T.log 2>&1
echo "rc $? t=$SECONDS"
grep -o "step times (ms).*" $OUT/sweep-$T.log | cut -c1-300
sed -n "/Dynamic k against/,/^$/p" $OUT/sweep-$T.log
echo "done t=$SECONDS"
