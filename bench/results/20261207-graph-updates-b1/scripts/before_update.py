"""For each XLA graph update in a when.py log: the host events (MARK lines) since the previous step call, and the
updated graph's size. Prints one line per update, then counts of the events that preceded updates."""
import collections
import re
import sys

events, seen = [], collections.Counter()
for line in open(sys.argv[1], errors="replace"):
    if line.startswith("MARK "):
        text = line[5:].strip()
        if text.startswith("call "):
            events = [text]
        else:
            events.append(text)
    elif "Create/Update command buffer" in line:
        m = re.search(r"after (\d+) executions.*num_commands=(\d+)", line)
        kinds = tuple(sorted({e.split(" (")[0].split(" [")[0] for e in events[1:]}))
        seen[kinds] += 1
        print(f"update of {m.group(2)} nodes after {m.group(1)} runs; since the call before: {events}")
print("events since the previous call, by update:", dict(seen))
