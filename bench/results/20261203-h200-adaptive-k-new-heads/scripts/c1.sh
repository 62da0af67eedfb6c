# call 1: GGUF part 1 onto the machine; warm the GPU up
set -u
export PYTHONUNBUFFERED=1
mkdir -p /root/w && cp .gpu/p1/m.xz.0 /root/w/ && ls -l /root/w
python3 -c "import jax, jax.numpy as jnp; x = jnp.ones((4096, 4096), jnp.bfloat16); print((x @ x).block_until_ready().shape, jax.__version__)"
nvidia-smi --query-gpu=name,memory.used,utilization.gpu --format=csv
nproc; echo "done t=$SECONDS"
