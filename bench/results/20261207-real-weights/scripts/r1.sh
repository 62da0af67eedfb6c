# call R1 (issue 19/20, real weights): GGUF part 1 onto the machine (/root/w), a warm-up matmul
set -u
mkdir -p /root/w && cp .gpu/p1/gg.00 /root/w/ || exit 1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; lscpu | grep "Model name"
python3 -c "import jax, jax.numpy as jnp; x = jnp.ones((4096, 4096), jnp.bfloat16); print((x @ x).block_until_ready().shape, jax.__version__)"
echo "done t=$SECONDS"
