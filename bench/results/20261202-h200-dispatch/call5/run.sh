# Issue 19: resident plan buffers + stable scratch (library defaults) against each off, in the step and the engine
export PYTHONPATH=. PYTHONUNBUFFERED=1
mkdir -p $OUT/r
python3 -c "import jax, jax.numpy as jnp; x = jnp.ones((4096, 4096), jnp.bfloat16); print((x @ x).block_until_ready().shape)"
S="timeout 150 python3 bench/step_time.py --hf-config smollm2-135m --context 256 --iters 30 --breakdown"
T="timeout 150 python3 bench/throughput.py --load-format dummy --hf-config smollm2-135m --dataset-name random --input-len 128"
E="--num-prompts 96 --max-tokens 256 --speculative-config {\"num_speculative_tokens\":3} --synthetic-acceptance 0.6 --decode-buckets 96 --prefill-buckets 2048"
run() { [ $SECONDS -gt 400 ] && { echo "skip $1 (time)"; return; }; name=$1; shift; echo "=== $name: $*"; "$@" --output-json $OUT/r/$name.json 2>$OUT/r/$name.err | grep -v "^INFO\|^WARNING\|^\[bench\|^$\|^|\|^Roofline\|^NOTE\|^wrote" ; grep -i "error" $OUT/r/$name.err | head -3; }
run tp96 $T $E
JAXSPEC_RESIDENT_PLAN=0 run tp96_noresident $T $E
JAXSPEC_RESIDENT_PLAN=0 JAXSPEC_STABLE_SCRATCH=0 run tp96_old $T $E
run tp1 $T --num-prompts 1 --max-tokens 1024 --ignore-eos --decode-buckets 1 --prefill-buckets 128
run tp1_m8 $T --num-prompts 1 --max-tokens 1024 --ignore-eos --decode-buckets 1 --prefill-buckets 128 --num-scheduler-steps 8
run k3 $S --batches 1,96 --k 3
tar czf $OUT/exp5.tgz -C $OUT r && rm -rf $OUT/r
