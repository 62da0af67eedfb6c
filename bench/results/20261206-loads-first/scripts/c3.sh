# call 3 (issue 19): Nsight Compute's per-instruction stall samples (SourceCounters) over one call of each of our
# four one-token kernels; Llama-3-8B shapes (random weights), one step at batch 1, fused layers off / on
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=.
D=bench/results/20261206-loads-first
mkdir -p $OUT/r
python3 -c "import jax, jax.numpy as jnp; x = jnp.ones((4096, 4096), jnp.bfloat16); print((x @ x).block_until_ready().shape)"
echo "=== [t=$SECONDS] ncu source"
timeout 200 ncu --profile-from-start off --clock-control none --target-processes all -k "regex:jaxspec" -c 4 \
  --section SourceCounters --section WarpStateStats -o $OUT/r/src -f python3 $D/scripts/nk.py ncu > $OUT/r/ncu-src.log 2>&1
echo "ncu rc $?"
ncu --import $OUT/r/src.ncu-rep --page source --csv --print-source sass > $OUT/r/src.csv 2> $OUT/r/src.err
python3 - <<'PY'
import csv, io, os
text = open(os.environ["OUT"] + "/r/src.csv").read()
# one CSV table per kernel, each starting with a header row
blocks, cur = [], []
for line in text.splitlines():
    if line.startswith('"Kernel Name"') or line.startswith('"#"') or line.startswith('"Address"'):
        if cur: blocks.append(cur)
        cur = [line]
    elif cur:
        cur.append(line)
if cur: blocks.append(cur)
print("tables", len(blocks), "first header:", blocks[0][0][:300] if blocks else text[:500])
for b in blocks:
    rows = list(csv.reader(io.StringIO("\n".join(b))))
    head = rows[0]
    src = next((i for i, h in enumerate(head) if h in ("Source", "SASS")), None)
    samp = next((i for i, h in enumerate(head) if "Sampling" in h and "All" in h), None)
    if src is None or samp is None:
        print("header", head[:12]); continue
    body = [r for r in rows[1:] if len(r) > samp and r[samp].replace(".", "").isdigit()]
    tot = sum(float(r[samp]) for r in body) or 1
    print(f"--- {len(body)} instructions, {tot:.0f} samples")
    for r in sorted(body, key=lambda r: -float(r[samp]))[:14]:
        print(f"{float(r[samp]) / tot * 100:5.1f}%  {r[src][:70]}")
PY
for f in 0 1; do
  echo "=== [t=$SECONDS] 8B step_time fused=$f"
  JAXSPEC_FUSED_DECODE=$f timeout 150 python3 bench/step_time.py --hf-config llama-3-8b --context 512 --iters 30 \
    --batches 1 --k 0 --output-json $OUT/r/st8b-f$f.json > $OUT/r/st8b-f$f.log 2>&1; echo "rc $?"
  grep "^B=" $OUT/r/st8b-f$f.log
done
echo "done t=$SECONDS"
