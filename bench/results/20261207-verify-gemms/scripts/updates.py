"""The CUDA-graph updates in a traced engine run (python updates.py TRACE.json.gz): each XLA command_buffer::update
with the host events before it on the Python thread (a plan write, the launches), and the count of updates and of
plan writes."""
import sys, collections
from jaxspec.bench.profile import load_trace
t = load_trace(sys.argv[1])
ev = t["traceEvents"]
procs = {e["pid"]: e["args"]["name"] for e in ev if e.get("ph") == "M" and e.get("name") == "process_name"}
threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in ev if e.get("ph") == "M" and e.get("name") == "thread_name"}
main = [e for e in ev if e.get("ph") == "X" and threads.get((e["pid"], e["tid"])) == "python3"]
main.sort(key=lambda e: e["ts"])
keep = [e for e in main if e["name"].startswith(("PjitFunction", "command_buffer::update", "cuGraphLaunch", "np.asarray", "command_buffer::execute"))]
# print sequence compressed around updates
for i, e in enumerate(keep):
    if e["name"] == "command_buffer::update":
        ctx = keep[max(0, i - 6): i + 3]
        print(" | ".join(f"{c['name'][:28]}:{c['dur']:.0f}" for c in ctx))
upd = [e for e in keep if e["name"] == "command_buffer::update"]
print(len(upd), "updates", sum(e["dur"] for e in upd) / 1e3, "ms;", sum(e["name"].startswith("PjitFunction(write_plan") for e in keep), "write_plan")
