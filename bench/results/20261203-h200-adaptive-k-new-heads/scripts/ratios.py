import json, sys
for d in ("gsm8k_test", "held_out"):
    r = json.load(open(f"{sys.argv[1]}/sweep-{d}.json"))
    by = {}
    for p in r["points"]:
        by.setdefault(p["num_prompts"], {})[p["mode"]] = p
    row = []
    for n in sorted(by):
        m = by[n]; dyn = [v for k, v in m.items() if k.endswith("dynamic")][0]
        others = {k: v["output_tokens_per_s"] for k, v in m.items() if not k.endswith("dynamic") and not k.endswith("k=0")}
        best = max(others, key=others.get)
        row.append(f"{dyn['output_tokens_per_s']/others[best]:.3f} ({best.split()[-1] if 'k=' in best else 'none'}; host {dyn['host_busy_per_step_ms']:.2f} vs {m[[k for k in m if k.endswith('k=3')][0]]['host_busy_per_step_ms']:.2f})")
    print(d, " | ".join(f"{n}: {x}" for n, x in zip(sorted(by), row)))
