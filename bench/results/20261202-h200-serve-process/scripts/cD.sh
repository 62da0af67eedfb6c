# call D: the real SmolLM2 checkpoint; serving sweep with the engine process (the default), then the thread A/B
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=/root/site:.
cp .gpu/p4/m.xz.4 /root/w/ && mkdir -p weights/.cache/smollm2-135m-instruct /root/data
cat /root/w/m.xz.1 /root/w/m.xz.2 /root/w/m.xz.3 /root/w/m.xz.4 | xz -d -T4 > weights/.cache/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf
sha256sum weights/.cache/smollm2-135m-instruct/*.gguf
xz -dc .gpu/data/gsm8k_test.jsonl.xz > /root/data/gsm8k_test.jsonl
python3 -m jaxspec fetch 2>&1 | tail -2
ls weights/smollm2-135m-instruct/
mkdir -p $OUT/serve $OUT/serve-thread
python3 -c "import jax, jax.numpy as jnp; x = jnp.ones((4096, 4096), jnp.bfloat16); print((x @ x).block_until_ready().shape)"
echo "[$(date +%T)] start sweep (t=$SECONDS)"
OUT=$OUT/serve DATA=/root/data/gsm8k_test.jsonl CACHE=/root/jcache timeout 400 bash bench/serve_sweep.sh 2>&1 | tail -22
echo "[$(date +%T)] thread A/B (t=$SECONDS)"
[ $SECONDS -lt 470 ] && OUT=$OUT/serve-thread DATA=/root/data/gsm8k_test.jsonl CACHE=/root/jcache RATES=inf MODES="eagle-async eagle-sync" \
  SERVER_EXTRA=--disable-frontend-multiprocessing timeout $((580 - SECONDS)) bash bench/serve_sweep.sh 2>&1 | tail -8
tar czf $OUT/cD.tgz -C $OUT serve serve-thread && rm -rf $OUT/serve $OUT/serve-thread
echo "done t=$SECONDS"
