"""Host-side events of a jax.profiler trace (CUDA API calls, XLA runtime): count and time per step, by name;
steps = events whose name contains 'decode_step' on the host's main dispatch. usage: hostapi.py LOGDIR"""
import sys
from collections import defaultdict
from jaxspec.bench.profile import _device_events, _names, find_trace, load_trace
events = load_trace(find_trace(sys.argv[1]))["traceEvents"]
procs, threads = _names(events)
_, dev = _device_events(events, procs, threads)
dev_ids = {id(e) for e in dev}
dev_pids = {e["pid"] for e in dev}
host = [e for e in events if e.get("ph") == "X" and e.get("pid") not in dev_pids]
by = defaultdict(lambda: [0, 0.0])
for e in host:
    b = by[e["name"][:70]]
    b[0] += 1
    b[1] += e.get("dur", 0)
steps = max((n for name, (n, _) in by.items() if "decode_step" in name), default=1)
print(f"steps (most frequent 'decode_step' host event) {steps}; device kernels per step {len(dev) / steps:.1f}")
for name, (n, us) in sorted(by.items(), key=lambda x: -x[1][1])[:28]:
    print(f"  x{n / steps:7.1f}  {us / steps:8.1f} us/step  {name}")
