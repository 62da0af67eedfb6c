# call 7 (issue 20): Llama-3-8B shapes (random weights), EAGLE-1 K = 4, synthetic acceptance 0.6, 0.3, 0.9: the dynamic
# policy against every fixed k = 0..4 at 1-256 prompts, one process per acceptance, scanned layers, one run per point
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=.
mkdir -p /root/r && nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
run() {  # p, process timeout, timed-run budget
  echo "=== [t=$SECONDS] p=$1"
  timeout $2 python3 bench/throughput.py --load-format dummy --hf-config llama-3-8b \
    --speculative-config '{"method": "eagle", "num_speculative_tokens": 4}' --synthetic-acceptance $1 \
    --dataset-name random --input-len 128 --max-tokens 256 --sweep --sweep-k --sweep-no-plain \
    --sweep-prompts 1,8,24,48,96,128,256 --decode-buckets 1,8,24,48,96,128,256 --prefill-buckets 2048 \
    --max-num-seqs 256 --layer-loop scan --time-budget-s $3 --results-dir /root/r/p$1 \
    --output-json /root/r/p$1.json > /root/r/p$1.log 2>&1
  echo "rc $? t=$SECONDS"; grep -E "^\[bench|compiled" /root/r/p$1.log | tail -4 | cut -c1-160
}
run 0.6 195 170
run 0.3 160 135
left=$((505 - SECONDS)); run 0.9 $((left - 12)) $((left - 40))
tar czf $OUT/c7.tgz -C /root r
python3 - <<'PY'
import json, glob, collections
for f in sorted(glob.glob("/root/r/p*.json")):
    r = json.load(open(f)); by = collections.defaultdict(dict)
    for pt in r["points"]:
        if pt.get("output_tokens_per_s"):
            by[pt["num_prompts"]][pt["mode"].split()[-1]] = pt["output_tokens_per_s"]
    for n, m in sorted(by.items()):
        fixed = {k: v for k, v in m.items() if k.startswith("k=")}
        best = max(fixed, key=fixed.get) if fixed else None
        dyn = m.get("dynamic")
        print(f"{f.split('/')[-1]} n={n}: dynamic {dyn and round(dyn)} best {best} {best and round(fixed[best])} "
              f"ratio {dyn and best and round(dyn / fixed[best], 3)}")
PY
echo "done t=$SECONDS"
