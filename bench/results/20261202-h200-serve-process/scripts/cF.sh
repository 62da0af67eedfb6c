# call F: the real SmolLM2 checkpoint; the serving sweep at HEAD (engine process, server-side text)
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=/root/site:.
cp .gpu/p4/m.xz.4 /root/w/ && mkdir -p weights/.cache/smollm2-135m-instruct /root/data
cat /root/w/m.xz.1 /root/w/m.xz.2 /root/w/m.xz.3 /root/w/m.xz.4 | xz -d -T4 > weights/.cache/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf
sha256sum weights/.cache/smollm2-135m-instruct/*.gguf
xz -dc .gpu/data/gsm8k_test.jsonl.xz > /root/data/gsm8k_test.jsonl
python3 -m jaxspec fetch 2>&1 | tail -1
git log --oneline -1 2>/dev/null
mkdir -p $OUT/serve
python3 -c "import jax, jax.numpy as jnp; x = jnp.ones((4096, 4096), jnp.bfloat16); print((x @ x).block_until_ready().shape)"
echo "[$(date +%T)] start sweep (t=$SECONDS)"
OUT=$OUT/serve DATA=/root/data/gsm8k_test.jsonl CACHE=/root/jcache timeout $((370 - SECONDS)) bash bench/serve_sweep.sh 2>&1 | tail -19
tar czf $OUT/cF.tgz -C $OUT serve && rm -rf $OUT/serve
echo "done t=$SECONDS"
