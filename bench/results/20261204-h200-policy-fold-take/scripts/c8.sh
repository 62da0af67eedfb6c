# call 1 of the doubling runs (fresh machine): a throwaway JAX process, the policies' host cost (pol2.py), GGUF part 1
python3 -c "import jax, jax.numpy as jnp; x = jnp.ones((4096, 4096), jnp.bfloat16); print((x @ x).block_until_ready().shape)"
PYTHONPATH=. timeout 400 python3 .gpu/pol2.py .gpu/tok > $OUT/pol2.log 2>&1; echo rc $?; grep -v INFO $OUT/pol2.log | tail -5
mkdir -p /root/w && cp .gpu/p1/m.xz.0 /root/w/ && ls -la /root/w | tail -1
