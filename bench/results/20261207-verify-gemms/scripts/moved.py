"""Which buffers a step program's calls find at a new address (what makes XLA update its CUDA graphs): bench/throughput.py
run with every step program call watched. Per (program, executable), each call's argument and result leaves (caches,
slot state, out, plan arrays; not the weights) by device address; printed: the calls, the calls where an argument
leaf had moved since that executable's previous call, and which leaves moved how often
(python moved.py THROUGHPUT_ARGS...)."""
import collections
import sys

import jax

import jaxspec.engine.model_runner as model_runner
from jaxspec.bench.throughput import main

last: dict = {}
moved: dict = collections.defaultdict(collections.Counter)
calls: collections.Counter = collections.Counter()
changed: collections.Counter = collections.Counter()


def _addresses(args) -> dict:
    leaves, _ = jax.tree_util.tree_flatten_with_path(args)
    return {jax.tree_util.keystr(path): leaf.unsafe_buffer_pointer() for path, leaf in leaves
            if isinstance(leaf, jax.Array)}


class Watched:
    def __init__(self, fn, key):
        self.fn, self.key = fn, key

    def __getattr__(self, name):
        return getattr(self.fn, name)

    def __call__(self, tw, dw, caches, state, out, *plan, spec):
        now = _addresses({"caches": caches, "state": state, "out": out, "plan": plan})
        calls[self.key] += 1
        before = last.get(self.key)
        if before is not None:
            diff = [name for name, a in now.items() if before.get(name) != a]
            if diff:
                changed[self.key] += 1
                moved[self.key].update(diff)
        last[self.key] = now
        return self.fn(tw, dw, caches, state, out, *plan, spec=spec)


_program = model_runner.ModelRunner._program


def watched_program(step, size, spec, twin=0):
    return Watched(_program(step, size, spec, twin), (step.__name__, size, spec.num_speculative_tokens, twin))


model_runner.ModelRunner._program = staticmethod(watched_program)
sys.argv = ["throughput.py"] + sys.argv[1:]
try:
    main()
finally:
    for key, n in calls.items():
        print(f"moved {key}: {n} calls, {changed[key]} with a moved argument; "
              + ", ".join(f"{name} x{c}" for name, c in moved[key].most_common(8)))
