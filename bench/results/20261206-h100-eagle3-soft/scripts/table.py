"""Short table of throughput JSONs: per point, output tok/s, ms a step, steps, mean acceptance length."""
import json, sys
for path in sys.argv[1:]:
    try:
        d = json.load(open(path))
    except Exception as e:
        print(path, "unreadable", e); continue
    for p in d["points"]:
        print(f"{path.rsplit('/', 1)[-1]:22s} {p['num_prompts']:4d} {p['mode'][:24]:24s} {'async' if p['async'] else 'sync ':5s}"
              f" {p['output_tokens_per_s']:10.1f} tok/s {p['wall_per_step_ms']:7.3f} ms/step {p['num_steps']:5d} steps"
              f" acc {p.get('mean_acceptance_length') or 0:.2f}")
