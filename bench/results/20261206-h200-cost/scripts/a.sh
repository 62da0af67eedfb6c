# call 1: GGUF part 1 to /root/w; the card; a warm-up (random SmolLM2-shaped weights, greedy and the options' step)
set -u
export PYTHONUNBUFFERED=1
mkdir -p /root/w /root/m $OUT
cp .gpu/p1/gg.00 /root/w/ && echo "part 1 copied"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; lscpu | grep -E "Model name"
python3 -c "import jax, jax.numpy as jnp; x = jnp.ones((4096, 4096), jnp.bfloat16); print((x @ x).block_until_ready().shape, jax.__version__)"
for S in '{"temperature": 0.0}' '{"temperature": 0.0, "logprobs": 5, "presence_penalty": 0.5}'; do
  echo "=== [t=$SECONDS] step_time $S"
  PYTHONPATH=. timeout 120 python3 bench/step_time.py --hf-config smollm2-135m --k 3 --batches 96 --context 512 \
    --iters 30 --sampling "$S" > /root/m/step.log 2>&1
  echo "rc $?"; grep -E "ms per step" /root/m/step.log | head -2
done
echo "done t=$SECONDS"
