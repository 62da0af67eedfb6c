# issue 17: the extended step's device time with the processors' variants (base = HEAD 0aa58e1; barrier = the block
# maxima behind an optimization barrier; both = barrier + the bans scattered into the raw logits first), random
# SmolLM2 weights, EAGLE-1 k = 3, batch 96, context 512, logprobs=5 + presence_penalty=0.5; greedy once
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=.
mkdir -p $OUT/r
python3 -c "import jax, jax.numpy as jnp; x = jnp.ones((4096, 4096), jnp.bfloat16); print((x @ x).block_until_ready().shape, jax.__version__)"
S="python3 bench/step_time.py --hf-config smollm2-135m --k 3 --batches 96 --context 512 --iters 40"
P='{"logprobs": 5, "presence_penalty": 0.5}'
run() { name=$1; shift; echo "=== [t=$SECONDS] $name"
  timeout 120 $S --profile-dir /root/prof-$name --output-json $OUT/r/$name.json "$@" > $OUT/r/$name.log 2>&1
  grep -E "^B=" $OUT/r/$name.log | head -1; grep -E "^B=" $OUT/r/$name.log | tail -1 | cut -c1-60
  grep -E "select_fusion|reduce_fusion|sort|scatter_fusion" $OUT/r/$name.log | head -8 > $OUT/r/$name.top; }
run greedy
for round in 1 2; do
  for v in base barrier both; do
    cp .gpu/processors_$v.py jaxspec/engine/processors.py
    run $v-$round --sampling "$P"
  done
done
cp .gpu/processors_both.py jaxspec/engine/processors.py
for f in $OUT/r/*.log; do echo "$(basename $f .log): $(grep -oE 'device ms per step [0-9.]+' $f) | $(grep -oE 'step +[0-9.]+ ms' $f)"; done
echo "done t=$SECONDS"
