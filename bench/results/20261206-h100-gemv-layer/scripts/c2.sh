# call 2: one step, steps back to back (bench/step_time.py, random SmolLM2 weights), fused layers off / on, batch 1
# without speculation and with k = 3 (verify 4 tokens, drafts 1), with a kernel profile
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=.
mkdir -p $OUT/r
python3 -c "import jax, jax.numpy as jnp; x = jnp.ones((4096, 4096), jnp.bfloat16); print((x @ x).block_until_ready().shape)"
S="python3 bench/step_time.py --hf-config smollm2-135m --context 512 --iters 30 --batches 1"
for k in 0 3; do for f in 0 1; do
  echo "=== [t=$SECONDS] step_time k=$k fused=$f"
  JAXSPEC_FUSED_DECODE=$f timeout 140 $S --k $k --profile-dir /root/p$k-$f \
    --output-json $OUT/r/st-k$k-f$f.json > $OUT/r/st-k$k-f$f.log 2>&1; echo "rc $?"
done; done
python3 - <<'PY'
import json, glob, os
out = os.environ["OUT"]
print("file              step_ms  kernel_ms  launches")
for f in sorted(glob.glob(f"{out}/r/st-*.json")):
    d = json.load(open(f))
    for r in d["rows"]:
        ks = r.get("kernels_per_step") or []
        print(f"{os.path.basename(f):16s} {r['step_s'] * 1e3:8.3f} {sum(k['ms'] for k in ks):9.3f} {sum(k['count'] for k in ks):9.1f}")
PY
echo "done t=$SECONDS"
