# call A: wheels + GGUF part 1; profile of the extended step (random SmolLM2 weights, k=3, batch 96)
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /root/site .whl/*.whl || exit 1
mkdir -p /root/w $OUT/r && cp .gpu/p1/m.xz.1 /root/w/
export PYTHONPATH=/root/site:.
python3 -c "import jax, jax.numpy as jnp; x = jnp.ones((4096, 4096), jnp.bfloat16); print((x @ x).block_until_ready().shape)"
S="python3 bench/step_time.py --hf-config smollm2-135m --k 3 --batches 96 --context 512 --iters 40"
run() { name=$1; shift; echo "=== [t=$SECONDS] $name"; timeout 200 $S --profile-dir /root/prof3-$name --output-json $OUT/r/$name.json "$@" > $OUT/r/$name.log 2>&1; grep -E "^B=" $OUT/r/$name.log | head -3; }
run greedy
run logprobs --sampling '{"logprobs": 5}'
run presence --sampling '{"logprobs": 5, "presence_penalty": 0.5}'
tar czf $OUT/cA.tgz -C $OUT r && rm -rf $OUT/r
echo "done t=$SECONDS"
