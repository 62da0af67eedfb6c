# call 1 (issue 19, row-by-row GEMV kernels in fused_layer): warm-up; GPU tests of the fused layers against XLA's;
# each kernel alone against XLA's ops, variants of the GEMV knobs (kg.py)
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=.
D=bench/results/20261206-h100-gemv-layer
mkdir -p $OUT/r
python3 -c "import jax, jax.numpy as jnp; x = jnp.ones((4096, 4096), jnp.bfloat16); print((x @ x).block_until_ready().shape, jax.__version__)"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; lscpu | grep "Model name"
echo "=== [t=$SECONDS] gpu tests"
JAX_PLATFORMS=cuda timeout 200 python3 -m pytest -q tests/test_gpu.py -k fused -p no:cacheprovider > $OUT/r/gpu-tests.log 2>&1
echo "tests rc $?"; tail -3 $OUT/r/gpu-tests.log
echo "=== [t=$SECONDS] kernels"
timeout 330 python3 $D/scripts/kg.py > $OUT/r/kg.log 2>&1; echo "kg rc $?"
cp $OUT/kg.json $OUT/r/ 2>/dev/null
grep -v Warning $OUT/r/kg.log | tail -22
echo "done t=$SECONDS"
