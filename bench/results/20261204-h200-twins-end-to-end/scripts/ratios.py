"""dynamic / best of {no speculation, fixed k} per prompt count, for each sweep JSON given."""
import json, sys
from collections import defaultdict
for f in sys.argv[1:]:
    r = json.load(open(f))
    by = defaultdict(dict)
    for p in r["points"]:
        if p.get("output_tokens_per_s"):
            by[p["num_prompts"]][p["mode"].split()[-1] if "k=" in p["mode"] or "dynamic" in p["mode"] else "none"] = p
    cells = []
    for n in sorted(by):
        m = by[n]
        others = {k: v["output_tokens_per_s"] for k, v in m.items() if k != "dynamic"}
        if "dynamic" not in m or not others:
            cells.append(f"{n}: incomplete {sorted(m)}")
            continue
        best = max(others, key=others.get)
        d = m["dynamic"]
        cells.append(f"{n}: {d['output_tokens_per_s'] / others[best]:.3f} (best {best}; dyn {d['num_steps_by_k']})")
    print(f.split("/")[-1], "\n  " + "\n  ".join(cells))
