# call 1 (fused layers, issue 19): GGUF part 1 onto the machine, warm-up; the GPU tests (Triton-compiled fused kernels vs the XLA layers);
# kernel profiles of one step at batch 1 (k = 0) and 1 / 4 rows (k = 3), fused off / on
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=.
mkdir -p /root/w $OUT/r && cp .gpu/p1/m.xz.0 /root/w/
python3 -c "import jax, jax.numpy as jnp; x = jnp.ones((4096, 4096), jnp.bfloat16); print((x @ x).block_until_ready().shape, jax.__version__)"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; lscpu | grep "Model name"
echo "=== [t=$SECONDS] gpu tests"
JAX_PLATFORMS=cuda timeout 240 python3 -m pytest -q -x tests/test_gpu.py -p no:cacheprovider > $OUT/r/gpu-tests.log 2>&1
echo "tests rc $?"; tail -3 $OUT/r/gpu-tests.log
S="python3 bench/step_time.py --hf-config smollm2-135m --context 512 --iters 30"
for f in 0 1; do
  echo "=== [t=$SECONDS] step_time fused=$f"
  JAXSPEC_FUSED_DECODE=$f timeout 120 $S --batches 1 --k 0 --breakdown --profile-dir /root/p0-$f \
    --output-json $OUT/r/st-k0-f$f.json > $OUT/r/st-k0-f$f.log 2>&1; echo "k0 rc $?"
  JAXSPEC_FUSED_DECODE=$f timeout 120 $S --batches 1,4 --k 3 --profile-dir /root/p3-$f \
    --output-json $OUT/r/st-k3-f$f.json > $OUT/r/st-k3-f$f.log 2>&1; echo "k3 rc $?"
done
python3 - <<'PY'
import json, glob, os, re, collections
out = os.environ["OUT"]
for f in sorted(glob.glob(f"{out}/r/st-*.json")):
    d = json.load(open(f))
    for r in d["rows"]:
        ks = r.get("kernels_per_step") or []
        print(os.path.basename(f), "batch", r["batch"], "k", r["k"], "step_ms", round(r["step_s"] * 1e3, 3),
              "launches", round(sum(k["count"] for k in ks), 1), "kernel_ms", round(sum(k["ms"] for k in ks), 3))
PY
cd $OUT && tar czf r.tgz r && rm -rf r
echo "done t=$SECONDS"
