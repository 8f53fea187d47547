#!/usr/bin/env python3
"""Medians and ranges of benchmarks/queues_ab.sh's output, per row and
setting: one-way latency (µs) for ping-pong, MB/s for stream."""
import re
import statistics
import sys
from collections import defaultdict

rows = defaultdict(list)
for line in open(sys.argv[1]):
    f = line.split()
    if len(f) < 3:
        continue
    load, q = f[0], f[1][2:]
    if f[2] == "sockperf64":
        m = re.search(r"percentile 50.000 = +([0-9.]+)", line)
        if m:
            rows[(load, "sockperf 64 B pp (us)", q)].append(float(m.group(1)))
        continue
    kv = dict(x.split("=", 1) for x in f[2:] if "=" in x)
    if "size" not in kv or kv.get("conn", "").strip(",") != "mode=direct":
        continue
    if kv["mode"] == "pingpong":
        rows[(load, f"{kv['size']} B pingpong (us)", q)].append(float(kv["lat_us_median"]))
    else:
        rows[(load, f"{kv['size']} B stream (MB/s)", q)].append(float(kv["mbps"]))
keys = sorted({(k[0], k[1]) for k in rows}, key=lambda k: (k[0], "stream" in k[1], "sockperf" in k[1],
                                                          int(k[1].split()[0]) if k[1][0].isdigit() else 0))
print("load   row                         cross: median (min-max) n     all: median (min-max) n")
for load, row in keys:
    out = [f"{load:6} {row:27}"]
    for q in ("cross", "all"):
        v = rows.get((load, row, q), [])
        out.append(f"{statistics.median(v):9.3f} ({min(v):.3f}-{max(v):.3f}) {len(v)}" if v else "   -")
    print("  ".join(out))
