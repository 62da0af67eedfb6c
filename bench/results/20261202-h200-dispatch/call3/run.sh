# Issue 19 item 1: XLA's command-buffer update modes (stable addresses for the graphs' buffers)
export PYTHONPATH=. PYTHONUNBUFFERED=1
mkdir -p $OUT/r
python3 -c "import jax, jaxlib; print(jax.__version__, jaxlib.__version__)"
for m in SKIP_TEMP SKIP_PROFILED; do
python3 -c "
import jax, jax.numpy as jnp
f = jax.jit(lambda x: x @ x + 1, compiler_options={'xla_gpu_command_buffer_update_mode': '$m'})
print('$m via compiler_options:', float(f(jnp.ones((64, 64)))[0, 0]))" 2>&1 | tail -1
done
S="timeout 150 python3 bench/step_time.py --hf-config smollm2-135m --context 256 --iters 30 --breakdown"
run() { [ $SECONDS -gt 520 ] && { echo "skip $1 (time)"; return; }; name=$1; shift; echo "=== $name: $*"; "$@" --output-json $OUT/r/$name.json 2>$OUT/r/$name.err | grep -v "^INFO\|^WARNING" ; grep -i "error\|unknown" $OUT/r/$name.err | head -3; }
XLA_FLAGS=--xla_gpu_command_buffer_update_mode=SKIP_TEMP run k0_skiptemp $S --batches 1,96 --k 0
XLA_FLAGS=--xla_gpu_command_buffer_update_mode=SKIP_PROFILED run k0_skipprof $S --batches 1,96 --k 0
XLA_FLAGS=--xla_gpu_command_buffer_update_mode=SKIP_PROFILED run k3_skipprof $S --batches 1,96 --k 3
XLA_FLAGS=--xla_gpu_command_buffer_update_mode=SKIP_PROFILED run k0_m8_skipprof $S --batches 1 --k 0 --num-steps 8
run k3_base $S --batches 1,96 --k 3
tar czf $OUT/exp3.tgz -C $OUT r && rm -rf $OUT/r
