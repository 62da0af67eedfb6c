"""Where a traced engine run's host time goes, per dispatch: the host threads' events by total time (XLA's and the
CUDA driver's launch, update and wait events) and the device's idle gaps between kernels
(python tracehost.py LOG_DIR NUM_DISPATCHES)."""
import collections
import sys

from jaxspec.bench.profile import find_trace, load_trace

trace = load_trace(find_trace(sys.argv[1]))
dispatches = float(sys.argv[2])
events = trace["traceEvents"]
procs = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"}
threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "thread_name"}
by_thread = collections.defaultdict(list)
for e in events:
    if e.get("ph") == "X":
        by_thread[(e["pid"], e["tid"])].append(e)
device = [k for k in by_thread if "/device:GPU" in procs.get(k[0], "") and threads.get(k, "").startswith("Stream")]
host = sorted((k for k in by_thread if k not in device and "/device" not in procs.get(k[0], "")),
              key=lambda k: -sum(e["dur"] for e in by_thread[k]))
for k in host[:4]:
    total = collections.Counter()
    count = collections.Counter()
    for e in by_thread[k]:
        total[e["name"][:70]] += e["dur"]
        count[e["name"][:70]] += 1
    print(f"--- host {procs.get(k[0])} / {threads.get(k)}: us per dispatch (calls per dispatch)")
    for name, us in total.most_common(18):
        print(f"{us / dispatches:9.1f} ({count[name] / dispatches:6.1f})  {name}")
kernels = sorted((e["ts"], e["ts"] + e["dur"]) for k in device for e in by_thread[k])
if not kernels:
    sys.exit("--- no device streams in the trace")
gaps = []
end = kernels[0][1]
for s, e in kernels[1:]:
    if s > end:
        gaps.append(s - end)
    end = max(end, e)
span = kernels[-1][1] - kernels[0][0]
gaps.sort(reverse=True)
print(f"--- device: span {span / 1e3:.1f} ms, {len(kernels)} kernels, idle {sum(gaps) / 1e3:.2f} ms "
      f"({sum(gaps) / span:.1%}); idle per dispatch {sum(gaps) / dispatches:.1f} us; "
      f"gaps > 20 us: {sum(g > 20 for g in gaps)} ({sum(g for g in gaps if g > 20) / 1e3:.2f} ms); largest "
      + ", ".join(f"{g:.0f}" for g in gaps[:8]))
