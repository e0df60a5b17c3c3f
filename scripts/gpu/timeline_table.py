#!/usr/bin/env python3
"""Where a graphed step's time goes, kernel by kernel, from kernel_timeline.c's CSV.

Under programmatic dependent launch a kernel starts (its blocks resident, waiting)
before the previous one ends, so its duration overstates its cost. What it adds to
the step is its *link*: its end minus the end of the kernel before it in the graph
replay. The links of a replay add up to the replay's span (first start to last
end). This script takes the graph with the most replays (or --graph ID), splits its
records into replays (its node count each), and prints, per node in launch order,
the median over replays of the link and of the duration, then the links summed by
kernel name, as `SUMMARY timeline ...` lines.

    python3 scripts/gpu/timeline_table.py /tmp/t.csv [--graph ID] [--skip N] [--layer K|auto,FIRST]

With --whole it instead accounts for a whole run (a `minisgl bench`, say): the span
from the first kernel's start to the last one's end, split into the time the GPU ran
no kernel and each kernel's own share (its end minus the later of its start and every
earlier kernel's end), summed by kernel name and by graph (eager launches as graph 0).
"""
import argparse
import csv
import re
import statistics
import sys
from collections import defaultdict


def short_name(mangled: str) -> str:
    """The kernel's qualified name without template arguments (Itanium nested names
    by hand: no c++filt on the GPU machine)."""
    m = re.match(r"_ZN((?:\d+[A-Za-z_]\w*?)+)(?:I|E|C|D)", mangled)
    if m:
        parts, rest = [], m.group(1)
        while rest:
            n = re.match(r"(\d+)", rest)
            if not n:
                break
            k = int(n.group(1))
            start = len(n.group(1))
            parts.append(rest[start : start + k])
            rest = rest[start + k :]
        if parts:
            return "::".join(parts)
    m = re.match(r"_Z(\d+)(\w+)", mangled)
    if m:
        return m.group(2)[: int(m.group(1))]
    return mangled.split("(")[0][:60]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--graph", type=int, default=None, help="graph id (default: the most replayed)")
    ap.add_argument("--skip", type=int, default=3, help="replays skipped at the start (warm-up)")
    ap.add_argument("--label", default="", help="prefix of the SUMMARY lines")
    ap.add_argument(
        "--layer",
        default=None,
        help="K,FIRST: also the median link of each of a layer's K kernels, over the layers "
        "after the first, the layers starting at kernel FIRST (Qwen3-0.6B bs=1: 7,2); "
        "K = auto: the smallest width at which the kernel names repeat",
    )
    ap.add_argument("--whole", action="store_true", help="account for the whole run instead of one graph")
    ap.add_argument("--top", type=int, default=25, help="--whole: the kernel names listed")
    args = ap.parse_args()
    if args.whole:
        return whole_run(args)

    by_graph = defaultdict(list)
    with open(args.csv, newline="") as f:
        for r in csv.DictReader(f):
            g = int(r["graph_id"])
            if g:
                by_graph[g].append(r)
    if not by_graph:
        print("SUMMARY timeline: no graph kernels in", args.csv)
        return 1
    nodes = {g: len({r["graph_node_id"] for r in rs}) for g, rs in by_graph.items()}
    replays_of = {g: len(rs) // nodes[g] for g, rs in by_graph.items()}
    for g in sorted(by_graph):
        print(f"SUMMARY timeline graphs: graph {g}: {nodes[g]} kernels, {replays_of[g]} replays")
    gid = args.graph if args.graph is not None else max(by_graph, key=lambda g: (replays_of[g], nodes[g]))
    recs = sorted(by_graph[gid], key=lambda r: int(r["start_ns"]))
    n = nodes[gid]
    replays = [recs[i : i + n] for i in range(0, len(recs) - n + 1, n)][args.skip :]
    if not replays:
        print(f"SUMMARY timeline: graph {gid} has too few replays")
        return 1

    order = [r["graph_node_id"] for r in sorted(replays[0], key=lambda r: int(r["end_ns"]))]
    info = {r["graph_node_id"]: r for r in replays[0]}
    links, durs, spans, busy = defaultdict(list), defaultdict(list), [], []
    # By position in end order: the link and how long before the previous kernel's
    # end the kernel started (its blocks resident early, under programmatic launch).
    pos_links, pos_early = defaultdict(list), defaultdict(list)
    for rep in replays:
        rep = sorted(rep, key=lambda r: int(r["end_ns"]))
        t0 = int(rep[0]["start_ns"])
        prev_end = t0
        for i, r in enumerate(rep):
            s, e = int(r["start_ns"]), int(r["end_ns"])
            links[r["graph_node_id"]].append((e - prev_end) / 1000)
            durs[r["graph_node_id"]].append((e - s) / 1000)
            pos_links[i].append((e - prev_end) / 1000)
            pos_early[i].append((prev_end - s) / 1000)
            prev_end = e
        spans.append((prev_end - t0) / 1000)
        busy.append(sum((int(r["end_ns"]) - int(r["start_ns"])) for r in rep) / 1000)

    label = f"{args.label} " if args.label else ""
    print(
        f"SUMMARY timeline {label}graph {gid}: {n} kernels, {len(replays)} replays; span median "
        f"{statistics.median(spans):.1f} us (sum of durations {statistics.median(busy):.1f} us: overlapped)"
    )
    for i, node in enumerate(order):
        r = info[node]
        print(
            f"SUMMARY timeline {label}{i:4d} {short_name(r['name'])[:44]:44s} grid {r['grid']:>12s} "
            f"link {statistics.median(links[node]):7.2f} us  dur {statistics.median(durs[node]):7.2f} us"
        )
    if args.layer:
        k_arg, first_arg = args.layer.split(",")
        first = int(first_arg)
        names = [short_name(info[node]["name"]) for node in order]
        k = layer_width(names, first) if k_arg == "auto" else int(k_arg)
        if k is None:
            print(f"SUMMARY timeline {label}layer: no repeating layer from kernel {first}")
        else:
            layer_table(label, info, order, pos_links, pos_early, k, first)
    per_name = defaultdict(lambda: [0, 0.0, 0.0])
    for node in order:
        k = short_name(info[node]["name"])
        per_name[k][0] += 1
        per_name[k][1] += statistics.median(links[node])
        per_name[k][2] += statistics.median(durs[node])
    total = sum(v[1] for v in per_name.values())
    for k, (count, link, dur) in sorted(per_name.items(), key=lambda kv: -kv[1][1]):
        print(
            f"SUMMARY timeline {label}by name {k[:48]:48s} x{count:4d} links {link:8.1f} us "
            f"({100 * link / total:4.1f}%), {link / count:6.2f} us each; durations {dur / count:6.2f} us each"
        )
    return 0


def layer_table(label, info, order, pos_links, pos_early, k, first):
    """The median link of each of a layer's `k` kernels, over the layers after the
    first (which pays for cold caches), the layers starting at kernel `first`."""
    layers = (len(order) - first) // k
    total = 0.0
    for j in range(k):
        r = info[order[first + k + j]]
        at = [first + k * layer + j for layer in range(1, layers)]
        link = statistics.median(v for i in at for v in pos_links[i])
        early = statistics.median(v for i in at for v in pos_early[i])
        total += link
        print(
            f"SUMMARY timeline {label}layer {j} {short_name(r['name'])[:40]:40s} grid {r['grid']:>10s} "
            f"link {link:6.2f} us, resident {early:6.2f} us before the previous end"
        )
    print(f"SUMMARY timeline {label}layer: {total:.1f} us a layer over {layers - 1} layers")


def layer_width(names, first):
    """The smallest K (2..32) such that the kernel names of the second layer (from
    position `first + K`) repeat every K kernels up to the graph's tail (lm_head and
    sampling, fewer than K kernels), over at least three layers: a graph's layer
    width, which differs between models and batch sizes. The first layer may differ
    in names (its qkv projection does not take the previous layer's norm)."""
    for k in range(2, 33):
        second = names[first + k : first + 2 * k]
        layers = 1
        while first + (layers + 1) * k <= len(names) and names[first + layers * k : first + (layers + 1) * k] == second:
            layers += 1
        if layers >= 4 and len(names) - (first + layers * k) < k:
            return k
    return None


def whole_run(args) -> int:
    """The whole run's span split into idle time and each kernel's own share."""
    recs = []
    with open(args.csv, newline="") as f:
        for r in csv.DictReader(f):
            recs.append((int(r["start_ns"]), int(r["end_ns"]), int(r["graph_id"]), r["name"]))
    if not recs:
        print("SUMMARY whole: no kernels in", args.csv)
        return 1
    recs.sort()
    by_name = defaultdict(lambda: [0, 0])
    by_graph = defaultdict(lambda: [0, 0])
    idle = 0
    covered = recs[0][0]
    for start, end, graph, name in recs:
        if start > covered:
            idle += start - covered
        own = max(0, end - max(start, covered))
        covered = max(covered, end)
        k = short_name(name)
        by_name[k][0] += 1
        by_name[k][1] += own
        by_graph[graph][0] += 1
        by_graph[graph][1] += own
    span = covered - recs[0][0]
    label = f"{args.label} " if args.label else ""
    print(
        f"SUMMARY whole {label}span {span / 1e6:.1f} ms, {len(recs)} kernels, GPU idle {idle / 1e6:.1f} ms "
        f"({100 * idle / span:.1f}%)"
    )
    for k, (count, own) in sorted(by_name.items(), key=lambda kv: -kv[1][1])[: args.top]:
        print(
            f"SUMMARY whole {label}name {k[:48]:48s} x{count:7d} {own / 1e6:8.1f} ms ({100 * own / span:4.1f}%), "
            f"{own / count / 1000:6.2f} us each"
        )
    graphs = sorted(by_graph.items(), key=lambda kv: -kv[1][1])
    for g, (count, own) in graphs[: args.top]:
        print(f"SUMMARY whole {label}graph {g:5d}: {count:7d} kernels, {own / 1e6:8.1f} ms ({100 * own / span:4.1f}%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
