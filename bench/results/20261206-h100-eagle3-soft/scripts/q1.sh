# call 1: GGUF part 1 and the seed-6 mix to /root/w; the card; a warm-up matmul
set -u
mkdir -p /root/w $OUT
cp .gpu/p1/gg.00 .gpu/keep/mix-seed6.npz /root/w/ && echo "copied"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader
python3 -c "import jax, jax.numpy as jnp; x = jnp.ones((4096, 4096), jnp.bfloat16); print((x @ x).block_until_ready().shape, jax.__version__)"
