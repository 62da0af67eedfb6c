# call 1: GGUF part 1 onto the machine; a throwaway JAX process; issue 17: kernel profile of the greedy and the
# extended step (random SmolLM2 weights, EAGLE-1 k = 3, batch 96, context 512), one process each
set -u
export PYTHONUNBUFFERED=1
mkdir -p /root/w $OUT/r && cp .gpu/p1/m.xz.0 /root/w/
export PYTHONPATH=.
python3 -c "import jax, jax.numpy as jnp; x = jnp.ones((4096, 4096), jnp.bfloat16); print((x @ x).block_until_ready().shape, jax.__version__)"
nvidia-smi --query-gpu=name,memory.used,clocks.sm --format=csv,noheader
S="python3 bench/step_time.py --hf-config smollm2-135m --k 3 --batches 96 --context 512 --iters 40"
run() { name=$1; shift; echo "=== [t=$SECONDS] $name"; timeout 200 $S --profile-dir /root/prof-$name --output-json $OUT/r/$name.json "$@" > $OUT/r/$name.log 2>&1; grep -E "^B=" $OUT/r/$name.log | head -3; }
run greedy
run presence --sampling '{"logprobs": 5, "presence_penalty": 0.5}'
echo "done t=$SECONDS"
