import json, sys
r = json.load(open(sys.argv[1]))
pts = {p["mode"]: p for p in r["points"]}
for m, p in pts.items():
    print(m[-40:], "| tok/s", round(p["output_tokens_per_s"]), "runs", [round(x) for x in p.get("repeats_output_tokens_per_s", [])],
          "| steps", p["num_steps"], "| ms/step wall %.3f host %.3f" % (p["wall_per_step_ms"], p["host_busy_per_step_ms"]),
          "| acc %.3f" % p["mean_acceptance_length"])
a, b = list(pts.values())
print("cost: tok/s %+.1f %%, ms/step %+.1f %%" % (100 * (b["output_tokens_per_s"] / a["output_tokens_per_s"] - 1),
      100 * (b["wall_per_step_ms"] / a["wall_per_step_ms"] - 1)))
