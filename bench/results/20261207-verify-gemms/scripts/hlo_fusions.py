"""What XLA's fusions of a step program hold: for each kind of fusion in the optimized HLO (the name without its
number: loop_pad_fusion, input_scatter_fusion, ...), how many there are and one instance's output shape and the
opcodes of its fused computation, and the JAX op it came from (python hlo_fusions.py MODULE_after_optimizations.txt [NAME_PREFIX ...])."""
import collections
import re
import sys

text = open(sys.argv[1]).read()
prefixes = tuple(sys.argv[2:])
bodies: dict[str, list[str]] = {}
name = None
for line in text.splitlines():
    head = re.match(r"^(?:ENTRY )?%?([\w.\-]+) \(.*\{\s*$", line)
    if head:
        name, bodies[name] = head.group(1), []
    elif line.startswith("}"):
        name = None
    elif name is not None:
        bodies[name].append(line)
instr = re.compile(r"^\s*(?:ROOT )?%?([\w.\-]+) = (\S+(?: \S+)*?) (fusion)\(.*calls=%?([\w.\-]+)")
seen: dict[str, list] = collections.defaultdict(list)
for comp, lines in bodies.items():
    for line in lines:
        m = instr.match(line)
        if m:
            where = re.search(r'op_name="([^"]*)"', line)
            seen[re.sub(r"(\.\d+)+$", "", m.group(1))].append((m.group(2), m.group(4), where and where.group(1)))
op = re.compile(r"=\s*(?:\S+(?: \S+)*?)\s+([a-z][\w\-]*)\(")
for base, found in sorted(seen.items(), key=lambda kv: -len(kv[1])):
    if prefixes and not base.startswith(prefixes):
        continue
    shape, called, where = found[0]
    ops = [m.group(1) for line in bodies.get(called, []) if (m := op.search(line))]
    counts = collections.Counter(o for o in ops if o != "parameter")
    print(f"{base}: {len(found)} x, e.g. {shape[:60]} <- " + ", ".join(f"{o} x{c}" if c > 1 else o
                                                                        for o, c in counts.most_common(12)))
    if where:
        print(f"    from {where[-110:]}")
