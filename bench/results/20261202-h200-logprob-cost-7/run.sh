# call E: logprobs / penalty cost at 96 prompts, and the 96-prompt async vs sync sweep (identity, no regression)
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=/root/site:.
mkdir -p $OUT/r
HEAD='{"method": "eagle", "model": "weights/eagle-smollm2-135m-instruct", "num_speculative_tokens": 3}'
B="python3 bench/throughput.py --model weights/smollm2-135m-instruct --dataset-path /root/data/gsm8k_test.jsonl --max-tokens 1024 --max-num-seqs 96 --prefill-buckets 2048"
run() { [ $SECONDS -gt 500 ] && { echo "skip $1 (time)"; return; }; name=$1; shift; echo "=== [t=$SECONDS] $name: $*"; timeout $((590 - SECONDS)) "$@" --output-json $OUT/r/$name.json > $OUT/r/$name.log 2>&1; grep -E "tok/s|ms/step|identical|host" $OUT/r/$name.log | grep -v "^INFO" | tail -6; }
run sweep96 $B --speculative-config "$HEAD" --num-prompts 96 --sweep --sweep-prompts 96 --sweep-no-plain --decode-buckets 1,64,96
run cost-greedy $B --speculative-config "$HEAD" --num-prompts 96 --decode-buckets 96 --repeats 3
run cost-logprobs $B --speculative-config "$HEAD" --num-prompts 96 --decode-buckets 96 --repeats 3 --logprobs 5
run cost-logprobs-presence $B --speculative-config "$HEAD" --num-prompts 96 --decode-buckets 96 --repeats 3 --logprobs 5 --presence-penalty 0.5
tar czf $OUT/cE.tgz -C $OUT r && rm -rf $OUT/r
echo "done t=$SECONDS"
