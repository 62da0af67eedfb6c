"""Tight loop (no engine): choose + observe per step, the policy deciding as in a steady batch (decisions stand up
to 32 steps), for 0aa58e1, 7c4d803 and the working tree; medians of 7 rounds of 3,000 steps."""
import importlib.util, statistics, time
import numpy as np
from jaxspec.engine import spec_policy
def load(name, path):
    spec = importlib.util.spec_from_file_location(name, path); m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); return m
mods = {"0aa58e1": load("a", "/tmp/sp_old.py"), "7c4d803": load("b", "/tmp/sp_9call.py"), "tree": spec_policy}
rng = np.random.default_rng(0)
for rows in (1, 8, 96, 256):
    res = {n: [] for n in mods}
    slots = [np.arange(rows) for _ in range(3000)]  # a new array each step, as the engine passes
    acc = [rng.integers(0, 4, rows) for _ in range(3000)]
    for rep in range(7):
        for n, m in mods.items():
            p = m.DynamicPolicy(3, 256)
            p.set_step_times({(rows, k): 1e-3 * (1 + 0.1 * k) for k in range(4)})
            t = time.perf_counter()
            for i in range(3000):
                p.choose(rows, rows, slots[i])
                p.observe(slots[i], 3, acc[i])
            res[n].append((time.perf_counter() - t) / 3000 * 1e6)
    print(f"rows {rows:3d}: " + ", ".join(f"{n} {statistics.median(v):.1f}" for n, v in res.items()) + " us/step")
