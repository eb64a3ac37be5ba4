#!/usr/bin/env python3
"""trace_report.py — where a replayed decode step's time goes, launch by
launch, from scripts/gpu/kernel_trace.c's CSV (run.sh `trace`).

Usage: trace_report.py [--nodes FILE] LABEL=TRACE.csv [LABEL=TRACE.csv ...]

In a chain of dependent launches a kernel's work begins once the kernel
before it has ended, so what a launch adds to a step is its *advance*:
its last block's end less the end of the launch before it (for a step's
first launch, less the end of the step before it, so the host's gap
between replays counts there). A step's advances sum to its period. Also
per launch: `early`, how long its first block was resident before the
launch ahead of it ended (dependent launches start blocks early), and
`span`, first block's start to last block's end.

Each graph's launches are ordered by their node ids (the capture order;
checked against the start times) and its replays told apart by counting
each node's runs in time order; the first run of each graph (the launch
that follows its capture, with cold caches) is left out, and so are the
graphs whose launch sequence differs from the most common one. Figures
are medians over the replays, in µs.

For one trace: the step's period and rate, then each kernel's launches a
step and their advances summed (µs a step and share), and a window of
single launches around the middle of the step. For several: the kernels'
summed advances side by side. --nodes FILE writes every launch of each
trace's step (median advance, early, span, blocks, threads, name).
"""

import collections
import csv
import statistics
import sys


def load(path):
    """The most common launch sequence in a trace: its kernel names, each
    launch's (blocks, threads), and the replays of each graph that ran it
    (a list per graph, the first run left out), each replay a list of
    (start, end) per launch, in ns."""
    by_graph = collections.defaultdict(lambda: collections.defaultdict(list))
    meta = {}
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            g, n = int(row["graph"]), int(row["node"])
            by_graph[g][n].append((int(row["start_ns"]), int(row["end_ns"])))
            meta[(g, n)] = (row["name"], int(row["blocks"]), int(row["threads"]))
    sequences = collections.defaultdict(list)
    for g, nodes in by_graph.items():
        order = sorted(nodes)
        runs = min(len(nodes[n]) for n in order)
        if runs != max(len(nodes[n]) for n in order):
            print(f"{path}: graph {g}: nodes ran {runs}..{max(len(nodes[n]) for n in order)} times "
                  f"(records lost?); their first {runs} runs kept", file=sys.stderr)
        for n in order:
            nodes[n].sort()
        replays = [[nodes[n][j] for n in order] for j in range(1, runs)]
        names = tuple(meta[(g, n)][0] for n in order)
        shape = [meta[(g, n)][1:] for n in order]
        sequences[names].append((g, shape, replays))
    if not sequences:
        sys.exit(f"{path}: no kernels of graphs in the trace")
    names, graphs = max(sequences.items(), key=lambda kv: sum(len(r) for _, _, r in kv[1]))
    runs = [rs for _, _, rs in graphs if rs]
    if not runs:
        sys.exit(f"{path}: its graphs ran once each (no replays)")
    return list(names), graphs[0][1], runs


def per_launch(runs):
    """Median advance, early and span of each launch (µs), and the median
    step period, from each graph's consecutive replays (`runs`)."""
    n = len(runs[0][0])
    adv = [[] for _ in range(n)]
    early = [[] for _ in range(n)]
    span = [[] for _ in range(n)]
    periods = []
    out_of_order = 0
    for replays in runs:
        for j, rep in enumerate(replays):
            prev_end = replays[j - 1][-1][1] if j > 0 else None
            for i, (s, e) in enumerate(rep):
                before = rep[i - 1][1] if i > 0 else prev_end
                span[i].append((e - s) / 1e3)
                if i > 0 and s < rep[i - 1][0]:
                    out_of_order += 1
                if before is not None:
                    adv[i].append((e - before) / 1e3)
                    early[i].append((before - s) / 1e3)
            if prev_end is not None:
                periods.append((rep[-1][1] - prev_end) / 1e3)
    med = lambda xs: statistics.median(xs) if xs else float("nan")
    return ([med(a) for a in adv], [med(a) for a in early], [med(a) for a in span],
            med(periods), len(periods), out_of_order)


def report(label, path, nodes_out):
    names, shape, runs = load(path)
    adv, early, span, period, nperiods, disorder = per_launch(runs)
    total = sum(adv)
    print(f"\n[{label}] {path}: {len(names)} launches a step, {sum(map(len, runs))} replays "
          f"of {len(runs)} graphs ({nperiods} consecutive pairs)")
    print(f"  step period {period:.1f} µs ({1e6 / period:.2f} steps/s); the advances sum to "
          f"{total:.1f} µs")
    if disorder:
        print(f"  note: {disorder} launches began before the launch captured ahead of them")
    kinds = collections.OrderedDict()
    for name, a, e, s in zip(names, adv, early, span):
        k = kinds.setdefault(name, [0, 0.0, 0.0, 0.0])
        k[0] += 1
        k[1] += a
        k[2] += e
        k[3] += s
    print(f"  {'kernel':<44} {'a step':>6} {'µs a step':>10} {'share':>6} {'µs each':>8} "
          f"{'early':>7} {'span':>7}")
    for name, (count, a, e, s) in sorted(kinds.items(), key=lambda kv: -kv[1][1]):
        print(f"  {name[:44]:<44} {count:>6} {a:>10.1f} {100 * a / total:>5.1f}% {a / count:>8.2f} "
              f"{e / count:>7.2f} {s / count:>7.2f}")
    lo, hi = max(0, len(names) // 2 - 8), min(len(names), len(names) // 2 + 9)
    print(f"  launches {lo}..{hi - 1} of the step (advance, early, span µs; blocks x threads):")
    for i in range(lo, hi):
        print(f"    {i:>4} {adv[i]:>7.2f} {early[i]:>7.2f} {span[i]:>7.2f} "
              f"{shape[i][0]:>5}x{shape[i][1]:<4} {names[i]}")
    if nodes_out:
        nodes_out.write(f"# [{label}] {path}\n# index advance_us early_us span_us blocks threads name\n")
        for i, name in enumerate(names):
            nodes_out.write(f"{i} {adv[i]:.3f} {early[i]:.3f} {span[i]:.3f} {shape[i][0]} "
                            f"{shape[i][1]} {name}\n")
    return {name: k[1] for name, k in kinds.items()}, total


def main(argv):
    nodes_out = None
    if len(argv) >= 2 and argv[0] == "--nodes":
        nodes_out = open(argv[1], "w")
        argv = argv[2:]
    if not argv:
        sys.exit(__doc__)
    results = []
    for arg in argv:
        label, _, path = arg.rpartition("=")
        results.append((label or path, *report(label or path, path, nodes_out)))
    if len(results) > 1:
        names = []
        for _, kinds, _ in results:
            names += [n for n in kinds if n not in names]
        width = max(10, *(len(label) for label, _, _ in results))
        print("\nµs a step, each kernel's advances summed:")
        print(f"  {'kernel':<44} " + " ".join(f"{label[:width]:>{width}}" for label, _, _ in results))
        for n in sorted(names, key=lambda n: -results[0][1].get(n, 0.0)):
            print(f"  {n[:44]:<44} " + " ".join(
                f"{kinds[n]:>{width}.1f}" if n in kinds else f"{'-':>{width}}" for _, kinds, _ in results))
        print(f"  {'(step)':<44} " + " ".join(f"{t:>{width}.1f}" for _, _, t in results))


if __name__ == "__main__":
    main(sys.argv[1:])
