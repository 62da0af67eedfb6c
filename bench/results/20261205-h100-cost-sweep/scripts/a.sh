# call A: GGUF part 1 onto the machine; warm-up; plain batch 1 (issue 19's figure) and the options' cost on random
# SmolLM2 weights with synthetic acceptance 0.6, this tree only
set -u
export PYTHONUNBUFFERED=1
mkdir -p /root/w /root/m $OUT && cp .gpu/p1/gg.00 /root/w/ || exit 1
python3 -c "import jax, jax.numpy as jnp; x = jnp.ones((4096, 4096), jnp.bfloat16); print((x @ x).block_until_ready().shape, jax.__version__)"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; lscpu | grep -E "Model name"; git log --oneline -1 2>/dev/null
export PYTHONPATH=.
echo "=== [t=$SECONDS] batch 1 plain"
timeout 150 python3 bench/throughput.py --load-format dummy --hf-config smollm2-135m --dataset-name random --input-len 128 \
  --num-prompts 1 --max-tokens 1024 --ignore-eos --decode-buckets 1 --prefill-buckets 128 --repeats 2 \
  --compilation-cache-dir /root/xla --results-dir /root/m --output-json /root/m/b1.json > /root/m/b1.log 2>&1
echo "rc $? t=$SECONDS"; cp /root/m/b1.json /root/m/b1.log $OUT/ 2>/dev/null; tail -4 /root/m/b1.log
for j in '{"temperature": 0.0}' '{"temperature": 0.0, "logprobs": 5, "presence_penalty": 0.5}'; do
  echo "=== [t=$SECONDS] step_time breakdown $j"
  timeout 100 python3 bench/step_time.py --hf-config smollm2-135m --context 256 --iters 30 --breakdown --batches 96 --k 3 \
    --sampling "$j" > /root/m/st.log 2>&1; echo "rc $?"; grep -E "^B=|dispatch parts" /root/m/st.log
  cat /root/m/st.log >> $OUT/step-time-breakdown.log
done
echo "done t=$SECONDS"
