# Issue 19 item 1: which argument addresses make XLA update its CUDA graphs (random SmolLM2 weights)
export PYTHONPATH=. PYTHONUNBUFFERED=1
mkdir -p $OUT/r
python3 -c "import jax, jax.numpy as jnp; x = jnp.ones((4096, 4096), jnp.bfloat16); print((x @ x).block_until_ready().shape)"
S="timeout 150 python3 bench/step_time.py --hf-config smollm2-135m --context 256 --iters 30 --breakdown"
run() { [ $SECONDS -gt 500 ] && { echo "skip $1 (time)"; return; }; name=$1; shift; echo "=== $name: $*"; "$@" --output-json $OUT/r/$name.json 2>$OUT/r/$name.err | grep -v "^INFO\|^WARNING" ; grep -i "error" $OUT/r/$name.err | head -3; }
run b1 $S --batches 1 --k 0
JAXSPEC_STAGE_PLAN=1 run b1_stage $S --batches 1 --k 0
run b96 $S --batches 96 --k 0
JAXSPEC_STAGE_PLAN=1 run b96_stage $S --batches 96 --k 0
JAXSPEC_CUBLAS_MIN_TOKENS=100000 run b96_triton $S --batches 96 --k 0
JAXSPEC_STAGE_PLAN=1 JAXSPEC_CUBLAS_MIN_TOKENS=100000 run b96_triton_stage $S --batches 96 --k 0
run b1_xla $S --batches 1 --k 0 --attn-impl xla
JAXSPEC_STAGE_PLAN=1 run k3_stage $S --batches 1,96 --k 3
JAXSPEC_STAGE_PLAN=1 run b1_m8_stage $S --batches 1 --k 0 --num-steps 8
tar czf $OUT/exp2.tgz -C $OUT r && rm -rf $OUT/r
