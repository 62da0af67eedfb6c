# call 2 (issue 19): where the one-token kernels' time goes. nk.py time (weights from HBM vs in L2); Nsight Compute
# (--clock-control none, caches flushed between passes: its default) over one call of each of our four kernels and
# XLA's GEMV fusions for the same work
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=.
D=bench/results/20261206-loads-first
mkdir -p $OUT/r
python3 -c "import jax, jax.numpy as jnp; x = jnp.ones((4096, 4096), jnp.bfloat16); print((x @ x).block_until_ready().shape)"
echo "=== [t=$SECONDS] time"
timeout 120 python3 $D/scripts/nk.py time > $OUT/r/nk-time.log 2>&1; echo "rc $?"; cp $OUT/nk-time.json $OUT/r/ 2>/dev/null
grep -v Warn $OUT/r/nk-time.log | tail -4
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1); echo "ncu: $NCU"
echo "=== [t=$SECONDS] ncu"
timeout 300 $NCU --profile-from-start off --clock-control none --target-processes all -k "regex:jaxspec|input_reduce" \
  -c 12 --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats \
  --section SchedulerStats --section MemoryWorkloadAnalysis --section InstructionStats -o $OUT/r/nk -f \
  python3 $D/scripts/nk.py ncu > $OUT/r/ncu.log 2>&1; echo "ncu rc $?"; grep -v Warn $OUT/r/ncu.log | tail -5
$NCU --import $OUT/r/nk.ncu-rep --page raw --csv > $OUT/r/nk-raw.csv 2>&1
$NCU --import $OUT/r/nk.ncu-rep --page details > $OUT/r/nk-details.txt 2>&1
python3 - <<'PY'
import csv, os
rows = list(csv.reader(open(os.environ["OUT"] + "/r/nk-raw.csv")))
head, units, data = rows[0], rows[1], rows[2:]
col = {h: i for i, h in enumerate(head)}
def g(r, k):
    return r[col[k]] if k in col else "?"
stall = [h for h in head if h.startswith("smsp__average_warps_issue_stalled_") and h.endswith("_per_issue_active.ratio")]
for r in data:
    name = g(r, "Kernel Name")[:28]
    print(f"{name:28s} dur {g(r, 'gpu__time_duration.sum')} {units[col['gpu__time_duration.sum']]} grid {g(r, 'launch__grid_size')}"
          f" regs {g(r, 'launch__registers_per_thread')} dram% {g(r, 'gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed')}"
          f" insts {g(r, 'smsp__inst_executed.sum')} cyc {g(r, 'sm__cycles_elapsed.max')}")
    top = sorted(((float(r[col[h]] or 0), h[34:-23]) for h in stall), reverse=True)[:6]
    print("   stalls/issue:", ", ".join(f"{n} {v:.1f}" for v, n in top))
PY
echo "done t=$SECONDS"
