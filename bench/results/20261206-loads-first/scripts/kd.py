"""fused_layer's four projection kernels alone (default knobs) against XLA's ops for the same work, at 1 and 4
tokens, SmolLM2 shapes, weights stacked over 30 layers: the functions of ../../20261206-h100-gemv-layer/scripts/kg.py
(device time a call: a profiler trace's kernels over 30 x 4 calls)."""
import json, os, sys
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "../../20261206-h100-gemv-layer/scripts"))
import kg  # noqa: E402

results = {}
for T in (1, 4):
    results[f"xla T={T}"] = kg.timed(kg.xla(T))
    results[f"ours T={T}"] = kg.timed(kg.ours(T))
json.dump(results, open(os.path.join(os.environ.get("OUT", "/tmp"), "kd.json"), "w"), indent=1)
print("us a call        qkv   attn_out   gate_up   down    sum   (own kernel alone)")
for name, r in results.items():
    own = {k: max(v["kernels"].items(), key=lambda kv: kv[1]) for k, v in r.items()}
    print(f"{name:10s}", " ".join(f"{r[k]['us']:8.2f}" for k in ("qkv", "attn_out", "gate_up", "down")),
          f"{sum(r[k]['us'] for k in ('qkv', 'attn_out', 'gate_up', 'down')):8.2f}  ",
          " ".join(f"{n[:16]}={us}" for n, us in own.values()))
