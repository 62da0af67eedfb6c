# call 1: GGUF part 1 onto the machine; a throwaway JAX process (the first process on a fresh machine runs slow)
set -u
mkdir -p /root/w && cp .gpu/p1/m.xz.0 /root/w/
python3 -c "import jax, jax.numpy as jnp; x = jnp.ones((4096, 4096), jnp.bfloat16); print((x @ x).block_until_ready().shape, jax.__version__)"
