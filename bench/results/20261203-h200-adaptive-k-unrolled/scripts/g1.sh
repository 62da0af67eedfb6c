# call 1: GGUF part 1 onto the machine; Llama-3-8B shapes, unrolled layers, synthetic p = 0.6: the adaptive-k sweep
# (its 37 programs compiled side by side by the new warm-up)
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=.
mkdir -p /root/w /root/r && cp .gpu/p1/m.xz.0 /root/w/
python3 -c "import jax, jax.numpy as jnp; x = jnp.ones((4096, 4096), jnp.bfloat16); print((x @ x).block_until_ready().shape, jax.__version__)"
nvidia-smi --query-gpu=name,memory.used --format=csv,noheader; nproc
run8b() {  # p, process timeout
  echo "=== [t=$SECONDS] p=$1"
  timeout $2 python3 bench/throughput.py --load-format dummy --hf-config llama-3-8b \
    --speculative-config '{"method": "eagle", "num_speculative_tokens": 4}' --synthetic-acceptance $1 \
    --dataset-name random --input-len 128 --max-tokens 256 --sweep --sweep-k --sweep-no-plain \
    --sweep-prompts 1,8,24,48,96,128,256 --decode-buckets 1,8,24,48,96,128,256 --prefill-buckets 2048 \
    --max-num-seqs 256 --time-budget-s $(($2 - 15)) --results-dir /root/r/p$1 \
    --output-json /root/r/sweep-p$1.json > /root/r/sweep-p$1.log 2>&1
  echo "rc $? t=$SECONDS"; grep -E "^\[bench" /root/r/sweep-p$1.log | cut -c1-200 | head -12
  grep -c "side by side" /root/r/sweep-p$1.log; grep "side by side" /root/r/sweep-p$1.log | tail -2 | cut -c1-160
  cp /root/r/sweep-p$1.json /root/r/sweep-p$1.log $OUT/ 2>/dev/null
}
run8b 0.6 $((585 - SECONDS))
python3 .gpu/ratios.py /root/r/sweep-p0.6.json
echo "done t=$SECONDS"
