#!/usr/bin/env python3
"""Per-kernel table of an `ncu --csv --metrics gpu__time_duration.sum,dram__bytes.sum` log.

Usage: ncu_table.py LOG [TITLE]. Prints one line per kernel name (launch count,
total and mean time, DRAM bytes and the rate they were moved at), heaviest first,
then the total: the numbers docs/PERF.md quotes for "where a step's time goes".
"""
import csv
import sys
from collections import defaultdict


def main():
    path = sys.argv[1]
    title = sys.argv[2] if len(sys.argv) > 2 else path
    lines = open(path, errors="replace").read().splitlines()
    start = next((i for i, l in enumerate(lines) if l.startswith('"ID"')), None)
    if start is None:
        print(f"{title}: no ncu csv rows")
        return
    launches = {}
    for row in csv.DictReader(lines[start:]):
        key = row.get("ID")
        name = row.get("Kernel Name", "?")
        short = name.split("(")[0].split("<")[0][:60]
        entry = launches.setdefault(key, {"name": short, "ns": 0.0, "bytes": 0.0})
        unit = row.get("Metric Unit", "")
        value = float(row.get("Metric Value", "0").replace(",", "") or 0)
        metric = row.get("Metric Name", "")
        if metric == "gpu__time_duration.sum":
            scale = {"nsecond": 1, "usecond": 1e3, "msecond": 1e6, "second": 1e9}.get(unit, 1)
            entry["ns"] = value * scale
        elif metric == "dram__bytes.sum":
            scale = {"byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9}.get(unit, 1)
            entry["bytes"] = value * scale
    per = defaultdict(lambda: [0, 0.0, 0.0])
    for e in launches.values():
        p = per[e["name"]]
        p[0] += 1
        p[1] += e["ns"]
        p[2] += e["bytes"]
    total = sum(p[1] for p in per.values()) or 1
    print(f"== {title}: {len(launches)} launches, {total / 1e3:.1f} us of kernels")
    for name, (n, ns, b) in sorted(per.items(), key=lambda kv: -kv[1][1]):
        rate = b / ns / 1e3 if ns else 0  # bytes per ns is GB/s
        print(f"{name:60s} n={n:4d} total={ns / 1e3:9.1f} us mean={ns / n / 1e3:7.2f} us "
              f"share={100 * ns / total:5.1f}% dram={b / 1e6:9.1f} MB {rate:5.2f} TB/s")


if __name__ == "__main__":
    main()
