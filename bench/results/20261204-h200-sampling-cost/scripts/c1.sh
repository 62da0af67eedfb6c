# call 1: GGUF part 1 onto the machine; a throwaway JAX process (the first process on a fresh machine runs slow);
# issue 17: logprobs=5 + presence_penalty=0.5 against greedy at 96 prompts, random weights, one process, alternating
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=.
mkdir -p /root/w && cp .gpu/p1/m.xz.0 /root/w/ && ls -la /root/w
python3 -c "import jax, jax.numpy as jnp; x = jnp.ones((4096, 4096), jnp.bfloat16); print((x @ x).block_until_ready().shape, jax.__version__)"
nvidia-smi --query-gpu=name,memory.used,clocks.sm --format=csv,noheader; nproc; python3 --version
timeout 200 python3 bench/throughput.py --load-format dummy --hf-config smollm2-135m --dataset-name random --input-len 128 \
  --num-prompts 96 --max-tokens 512 --speculative-config '{"num_speculative_tokens": 3}' --synthetic-acceptance 0.6 \
  --decode-buckets 96 --prefill-buckets 2048 --repeats 5 --sweep-sampling '{"logprobs": 5, "presence_penalty": 0.5}' \
  --results-dir $OUT --output-json $OUT/cost.json > $OUT/cost.log 2>&1
echo "rc $? t=$SECONDS"
grep -E "^Throughput|steps," $OUT/cost.log | cut -c1-170
echo "done t=$SECONDS"
