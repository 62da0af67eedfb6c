"""dynamic / best fixed mode per prompt count, from a sweep JSON's per-round figures: the best mode is the one of
highest median; each round's ratio pairs dynamic with it in the same round (modes run back to back in a round);
prints the ratio of medians and the median of the per-round ratios."""
import json, statistics, sys
from collections import defaultdict
for f in sys.argv[1:]:
    r = json.load(open(f))
    by = defaultdict(dict)
    for p in r["points"]:
        if p.get("output_tokens_per_s"):
            by[p["num_prompts"]][p["mode"]] = p
    print(f)
    for n in sorted(by):
        m = by[n]
        dyn = [k for k in m if k.endswith("dynamic")][0]
        others = {k: v for k, v in m.items() if k != dyn}
        best = max(others, key=lambda k: others[k]["output_tokens_per_s"])
        d, b = m[dyn]["repeats_output_tokens_per_s"], others[best]["repeats_output_tokens_per_s"]
        ratios = [x / y for x, y in zip(d, b)]
        print(f"  {n:4d}: medians {m[dyn]['output_tokens_per_s'] / others[best]['output_tokens_per_s']:.3f}, "
              f"paired {statistics.median(ratios):.3f} (best {best.split()[-1]}; rounds "
              + " ".join(f"{x:.2f}" for x in ratios) + ")")
