# issue 17: kernel profiles of the extended step (logprobs=5, presence_penalty=0.5; random SmolLM2 weights, EAGLE-1
# k = 3, batch 96, context 512) with the bf16 logits into the extended sampler and the single-pass greedy sampler
# (n3: block maxima, then a sum/ties pass processing again from inputs XLA cannot merge; n2: the same, merged; head: HEAD), with
# each one's optimized HLO; one process each
set -u
export PYTHONUNBUFFERED=1
mkdir -p $OUT/r
export PYTHONPATH=.
python3 -c "import jax, jax.numpy as jnp; x = jnp.ones((4096, 4096), jnp.bfloat16); print((x @ x).block_until_ready().shape, jax.__version__)"
S="python3 bench/step_time.py --hf-config smollm2-135m --k 3 --batches 96 --context 512 --iters 40"
OPT='{"logprobs": 5, "presence_penalty": 0.5}'
run() { name=$1; shift; echo "=== [t=$SECONDS] $name"; cp .gpu/processors_$name.py jaxspec/engine/processors.py
  XLA_FLAGS="--xla_dump_to=/root/dump-$name --xla_dump_hlo_module_re=.*decode_step.* --xla_dump_hlo_pass_re=NONE" \
    timeout 150 $S --profile-dir /root/prof-$name --output-json $OUT/r/$name.json --sampling "$OPT" > $OUT/r/$name.log 2>&1
  grep -E "^B=" $OUT/r/$name.log | head -2; sed -n '/device ms per step/,+14p' $OUT/r/$name.log | tail -14
  mkdir -p $OUT/r/hlo-$name; cp $(ls -S /root/dump-$name/*after_optimizations.txt | head -1) $OUT/r/hlo-$name/ 2>/dev/null; }
run n3
run n2
run head
run n3b
cd $OUT && tar czf r.tgz r && rm -rf r
echo "done t=$SECONDS"
