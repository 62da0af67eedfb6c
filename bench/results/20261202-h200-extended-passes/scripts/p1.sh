# profile the extended step's kernels: SmolLM2 shapes, random weights, EAGLE k=3, batch 96
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=.
mkdir -p $OUT/r
nvidia-smi --query-gpu=name,memory.used --format=csv
python3 -c "import jax, jax.numpy as jnp; x = jnp.ones((4096, 4096), jnp.bfloat16); print((x @ x).block_until_ready().shape)"
S="python3 bench/step_time.py --hf-config smollm2-135m --k 3 --batches 96 --context 512 --iters 40"
run() { name=$1; shift; echo "=== [t=$SECONDS] $name"; timeout 200 $S --profile-dir /root/prof-$name --output-json $OUT/r/$name.json "$@" > $OUT/r/$name.log 2>&1; grep -E "^B=|ms  x" $OUT/r/$name.log | head -45; }
run greedy
run logprobs --sampling '{"logprobs": 5}'
run presence --sampling '{"logprobs": 5, "presence_penalty": 0.5}'
tar czf $OUT/p1.tgz -C $OUT r && rm -rf $OUT/r
echo "done t=$SECONDS"
