#!/usr/bin/env python3
"""Medians and ranges of benchmarks/queues_ab.sh's raw.txt, per row and
variant: one-way latency (µs, the mean of a run) for ping-pong, MB/s for
stream. A run of the library counts only if both ends said direct."""
import statistics
import sys
from collections import defaultdict

runs = defaultdict(list)
dropped = defaultdict(int)
placements = set()
for line in open(sys.argv[1]):
    f = line.split()
    if len(f) != 6:
        continue
    placement, variant, size, mode, value, modes = f
    placements.add(placement)
    key = (int(size), mode, variant)
    if value == "failed" or (variant != "kernel" and modes != "mode=direct"):
        dropped[key] += 1
        continue
    runs[key].append(float(value))

print(f"placement {', '.join(sorted(placements))}; ping-pong: one-way µs (lower is better), "
      "stream: MB/s (higher is better)")
print("median (min-max) n; n counts the runs where both ends were direct")
print(f"{'row':22} {'kernel':>28} {'cross (provider)':>28} {'all (own queues)':>28}")
for size, mode in sorted({(k[0], k[1]) for k in list(runs) + list(dropped)},
                         key=lambda k: (k[1] == "stream", k[0])):
    unit = "us" if mode == "pingpong" else "MB/s"
    cells = []
    for variant in ("kernel", "cross", "all"):
        v = runs.get((size, mode, variant), [])
        cell = f"{statistics.median(v):.2f} ({min(v):.2f}-{max(v):.2f}) {len(v)}" if v else "-"
        if dropped.get((size, mode, variant)):
            cell += f" [{dropped[(size, mode, variant)]} not direct]"
        cells.append(f"{cell:>28}")
    print(f"{f'{size} B {mode} ({unit})':22} " + " ".join(cells))
