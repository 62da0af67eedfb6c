# issue 20: host work per step, dynamic policy vs fixed k = 3 in one LLM (SmolLM2 shapes, random weights, scanned
# layers, synthetic acceptance 0.7), at 1 and 256 rows, and the cProfile difference
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=.
python3 -c "import jax, jax.numpy as jnp; x = jnp.ones((4096, 4096), jnp.bfloat16); print((x @ x).block_until_ready().shape, jax.__version__)"
for B in 1 256; do echo "=== [t=$SECONDS] B=$B"; timeout 250 python3 .gpu/dynprof.py .gpu/tok $B full 7 2>&1 | grep -v "^INFO\|^WARNING" | tail -30; done
echo "done t=$SECONDS"
