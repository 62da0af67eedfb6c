# call S3 (right after s2.sh): the preset's head (EAGLE-3, K = 3); issue 20's sweep on the held-out general prompts
# (no speculation / fixed k = 0..3 / dynamic, max_tokens 256, EOS ignored, medians of 3), the step-time model
# measured in 5 interleaved rounds and ranked non-decreasing in k: A without, B with prompt lookup (n-grams of 2-5)
# as the head's fallback. Arguments: the seconds it may run, the sweeps to run (A, B or AB), B's prompt counts
set -u
export PYTHONUNBUFFERED=1
export PYTHONPATH=/root/site:.
mkdir -p /root/m && cp -r .gpu/p3/eagle3-smollm2-135m-instruct weights/ || exit 1
H='"method": "eagle3", "model": "weights/eagle3-smollm2-135m-instruct", "num_speculative_tokens": 3'
D=${1:-590}  # seconds this call may run
sweep() {  # name, speculative config, prompt counts, seconds kept for what follows
  timeout $((D - SECONDS - $4)) python3 bench/throughput.py --model weights/smollm2-135m-instruct --speculative-config "$2" \
    --dataset-path .gpu/data/held_out.jsonl --max-tokens 256 --ignore-eos --sweep --sweep-k \
    --sweep-prompts $3 --decode-buckets $3 --prefill-buckets 2048 \
    --max-num-seqs 256 --layer-loop scan --repeats 3 --time-budget-s $((D - SECONDS - $4 - 25)) \
    --compilation-cache-dir /root/xla --results-dir /root/m \
    --output-json $OUT/sweep-$1.json > $OUT/sweep-$1.log 2>&1
  echo "$1 rc $? t=$SECONDS"
  grep -o "step times (ms).*" $OUT/sweep-$1.log | cut -c1-300
}
case ${2:-AB} in *A*) sweep A "{$H}" 1,8,24,48,96,128,256 $([ "${2:-AB}" = A ] && echo 0 || echo 180);; esac
case ${2:-AB} in *B*) sweep B "{$H, \"prompt_lookup_min\": 2, \"prompt_lookup_max\": 5}" ${3:-1,24,96,256} 0;; esac
for n in A B; do echo "== $n"; sed -n "/Dynamic k against/,/^$/p" $OUT/sweep-$n.log; done
echo "done t=$SECONDS"
