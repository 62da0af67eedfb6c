import glob, json, re, statistics, sys
from collections import defaultdict
d = sys.argv[1]
groups = defaultdict(list)
for p in sorted(glob.glob(f"{d}/*.json")):
    r = json.load(open(p))
    m = re.match(r"(.+)-rate(\w+)-n(\d+)-r(\d)", r["label"])
    groups[(m.group(1), m.group(2), int(m.group(3)))].append(r)
print("| mode | rate | requests | runs | TPOT p50 ms (each run) | median TPOT p50 | TTFT p50 ms (median) | out tok/s (median) | identical | engine ms/step in step / device wait / emit (median run) |")
print("|---|---|---|---|---|---|---|---|---|---|")
for key in sorted(groups, key=lambda k: (k[0].split("-")[0], k[1] != "inf", k[2], k[0])):
    rs = groups[key]
    t = [r["median_tpot_ms"] for r in rs]
    med = sorted(rs, key=lambda r: r["median_tpot_ms"])[(len(rs) - 1) // 2]
    same = [r["compare"] for r in rs if r.get("compare")]
    ident = ", ".join(f'{c["identical"]}/{c["compared"]}' for c in same) or "-"
    print(f'| {key[0]} | {key[1]} | {key[2]} | {len(rs)} | {" / ".join(f"{x:.2f}" for x in t)} | **{statistics.median(t):.2f}** | '
          f'{statistics.median(r["median_ttft_ms"] for r in rs):.0f} | {statistics.median(r["output_throughput"] for r in rs):,.0f} | {ident} | '
          f'{med["engine_step_ms"]:.2f} / {med["engine_host_wait_ms"]:.2f} / {med["engine_emit_ms"]:.2f} |')
