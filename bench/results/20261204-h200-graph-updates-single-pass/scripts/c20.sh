# call 1: GGUF part 1 onto the machine; a throwaway JAX process; issue 17: kernel profile of the greedy step and of
# the extended step (logprobs=5, presence_penalty=0.5) with the single-pass greedy sampler (new) and HEAD's
# processors.py (head), random SmolLM2 weights, EAGLE-1 k = 3, batch 96, context 512, one process each
set -u
export PYTHONUNBUFFERED=1
mkdir -p /root/w $OUT/r && cp .gpu/p1/m.xz.0 /root/w/
export PYTHONPATH=.
python3 -c "import jax, jax.numpy as jnp; x = jnp.ones((4096, 4096), jnp.bfloat16); print((x @ x).block_until_ready().shape, jax.__version__)"
S="python3 bench/step_time.py --hf-config smollm2-135m --k 3 --batches 96 --context 512 --iters 40"
OPT='{"logprobs": 5, "presence_penalty": 0.5}'
cp jaxspec/engine/processors.py /root/processors_new.py
run() { name=$1; shift; echo "=== [t=$SECONDS] $name"; timeout 150 $S --profile-dir /root/prof-$name --output-json $OUT/r/$name.json "$@" > $OUT/r/$name.log 2>&1; grep -E "^B=" $OUT/r/$name.log | head -2; }
run greedy
run opt-new-1 --sampling "$OPT"
cp .gpu/processors_head.py jaxspec/engine/processors.py
run opt-head-1 --sampling "$OPT"
cp /root/processors_new.py jaxspec/engine/processors.py
run opt-new-2 --sampling "$OPT"
cp .gpu/processors_head.py jaxspec/engine/processors.py
run opt-head-2 --sampling "$OPT"
cp /root/processors_new.py jaxspec/engine/processors.py
for n in opt-new-1 opt-head-1; do echo "--- $n top kernels"; sed -n '/device ms per step/,+22p' $OUT/r/$n.log; done
cd $OUT && tar czf r.tgz r && rm -rf r
echo "done t=$SECONDS"
