import sys, glob, json
from jaxspec.bench.profile import find_trace, load_trace, kernel_totals
res = {}
for d in sorted(glob.glob(sys.argv[1] + "/*async*")):
    rows = kernel_totals(load_trace(find_trace(d)))
    res[d] = rows
    tot = sum(r.get("total_ms", r.get("ms", 0)) for r in rows)
    print("==", d, "kernels", len(rows), "total ms %.2f" % tot)
    for r in rows[:14]:
        print("  ", {k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items()})
json.dump(res, open(sys.argv[2], "w"))
