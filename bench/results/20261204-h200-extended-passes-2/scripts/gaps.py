"""Idle gaps on the device stream of a jax.profiler trace: total idle per step and the largest gaps by the kernels
before and after them. usage: gaps.py LOGDIR NUM_STEPS"""
import sys
from collections import defaultdict
from jaxspec.bench.profile import _device_events, _names, find_trace, load_trace

events = load_trace(find_trace(sys.argv[1]))["traceEvents"]
steps = float(sys.argv[2])
procs, threads = _names(events)
how, dev = _device_events(events, procs, threads)
by_tid = defaultdict(list)
for e in dev:
    by_tid[(e["pid"], e.get("tid"))].append(e)
for tid, evs in by_tid.items():
    evs.sort(key=lambda e: e["ts"])
    print(how, threads.get(tid), len(evs), "events")
    gaps = defaultdict(lambda: [0.0, 0])
    total = 0.0
    end, prev = None, None
    for e in evs:
        if end is not None and e["ts"] > end:
            g = e["ts"] - end
            if g < 200:  # us: longer is the host between timed blocks
                total += g
                key = (prev[:40], e["name"][:40])
                gaps[key][0] += g
                gaps[key][1] += 1
        end = max(end or 0, e["ts"] + e["dur"])
        prev = e["name"]
    span = evs[-1]["ts"] + evs[-1]["dur"] - evs[0]["ts"]
    print(f"  idle (gaps < 200 us) per step {total / steps:.1f} us; span {span / 1e3:.1f} ms")
    for (a, b), (g, n) in sorted(gaps.items(), key=lambda x: -x[1][0])[:25]:
        print(f"  {g / steps:7.1f} us/step  x{n / steps:5.1f}  {a} -> {b}")
