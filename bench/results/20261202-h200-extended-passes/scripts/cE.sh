# call E: GGUF part 5, assemble, convert; logprobs / presence-penalty cost at 96 prompts (one process per line)
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=/root/site:.
cp .gpu/p5/m.xz.5 /root/w/ && mkdir -p weights/.cache/smollm2-135m-instruct /root/data $OUT/r
cat /root/w/m.xz.1 /root/w/m.xz.2 /root/w/m.xz.3 /root/w/m.xz.4 /root/w/m.xz.5 | xz -d -T4 > weights/.cache/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf
sha256sum weights/.cache/smollm2-135m-instruct/*.gguf
xz -dc .gpu/data/gsm8k_test.jsonl.xz > /root/data/gsm8k_test.jsonl
python3 -m jaxspec fetch 2>&1 | tail -1
python3 -c "import jax, jax.numpy as jnp; x = jnp.ones((4096, 4096), jnp.bfloat16); print((x @ x).block_until_ready().shape)"
HEAD='{"method": "eagle", "model": "weights/eagle-smollm2-135m-instruct", "num_speculative_tokens": 3}'
B="python3 bench/throughput.py --model weights/smollm2-135m-instruct --dataset-path /root/data/gsm8k_test.jsonl --max-tokens 1024 --max-num-seqs 96 --prefill-buckets 2048"
run() { [ $SECONDS -gt 480 ] && { echo "skip $1 (time)"; return; }; name=$1; shift; echo "=== [t=$SECONDS] $name: $*"; timeout $((590 - SECONDS)) "$@" --output-json $OUT/r/$name.json > $OUT/r/$name.log 2>&1; grep -E "tok/s|ms/step|identical|host" $OUT/r/$name.log | grep -v "^INFO" | tail -6; }
run cost-greedy $B --speculative-config "$HEAD" --num-prompts 96 --decode-buckets 96 --repeats 3
run cost-logprobs $B --speculative-config "$HEAD" --num-prompts 96 --decode-buckets 96 --repeats 3 --logprobs 5
run cost-logprobs-presence $B --speculative-config "$HEAD" --num-prompts 96 --decode-buckets 96 --repeats 3 --logprobs 5 --presence-penalty 0.5
run sweep96 $B --speculative-config "$HEAD" --num-prompts 96 --sweep --sweep-prompts 96 --sweep-no-plain --decode-buckets 1,64,96
tar czf $OUT/cE.tgz -C $OUT r && rm -rf $OUT/r
echo "done t=$SECONDS"
