# call 1: GGUF part 1 onto the machine; issue 17: top_n's block width (BLOCK 32 vs 16) in the extended step (with
# the block maxima behind a barrier), random SmolLM2 weights, EAGLE-1 k = 3, batch 96, context 512,
# logprobs=5 + presence_penalty=0.5, device ms per step from the kernel profile, twice each
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=.
mkdir -p /root/w $OUT/r && cp .gpu/p1/m.xz.0 /root/w/
python3 -c "import jax, jax.numpy as jnp; x = jnp.ones((4096, 4096), jnp.bfloat16); print((x @ x).block_until_ready().shape, jax.__version__)"
S="python3 bench/step_time.py --hf-config smollm2-135m --k 3 --batches 96 --context 512 --iters 40"
P='{"logprobs": 5, "presence_penalty": 0.5}'
run() { name=$1; shift; echo "=== [t=$SECONDS] $name"
  timeout 120 $S --profile-dir /root/prof-$name --output-json $OUT/r/$name.json "$@" > $OUT/r/$name.log 2>&1
  grep -E "^B=" $OUT/r/$name.log | head -1
  grep -E "select_fusion|reduce_fusion|sort" $OUT/r/$name.log | head -8; }
for round in 1 2; do
  for v in b32 b16; do
    cp .gpu/processors_$v.py jaxspec/engine/processors.py
    run $v-$round --sampling "$P"
  done
done
cp .gpu/processors_b32.py jaxspec/engine/processors.py
echo "done t=$SECONDS"
