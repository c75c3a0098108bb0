"""The persistent executor's traced work items, saved on the GPU and studied off it.

``bench/megakernel.py --records DIR`` (or ``ours(..., records=PATH)`` in bench/decode.py) saves
each persistent run's items (:func:`save`: task, parallel index, program, start and end in ns,
segment, InCore variant); this script reads them back on any machine::

    python bench/records.py DIR/*.npz [--top 12] [--layers N]

and prints, per InCore variant (over its tasks): the tasks, their mean items and the programs
that ran them, the **rounds** (the most items of a task one program ran; a task's items stream
at the bandwidth when every program is busy, so its span is about its rounds times an item),
the item's median and 90th percentile, and over its tasks the summed span and **tail** (a task's
last end after the earliest of its programs' last ends: how long programs that had finished
their share of the task waited while others ran its last round). A task's span past its median
item is the spread; two columns split it: the **skew** (its last item's start after its first's)
and the **slow** (its longest item past the median). Where the trace knows each item's
multiprocessor (the GPU's), the **shared** column is the median item of a task's items that ran
beside another of its items on one multiprocessor over those that ran alone there (1.00: no
difference; empty where a task has no items of both kinds).

``--layers N`` (a decode step of N layers) adds a layer's timeline: a variant's tasks, in task
order, cut into N equal groups (variants whose tasks are not a multiple of N, the embedding and
the LM head, are left out), a layer's groups in the order they start; per group its **gap** (its
first start after the previous group's last end; the first group's after the previous layer's),
its start **skew**, its **span** and its **ends** (first end to last end); medians over the
layers but the first and the last (of the groups' items), and the layer's span (its first
start to its last end).
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict

import numpy as np


def save(path: str, records, programs: int) -> None:
    """``records`` (:class:`pto.exec.base.ItemRecord`, one per item) to ``path`` (.npz), times
    from the first item's start; ``programs``: the launch's (the first segment's)."""
    funcs = sorted({r.func for r in records})
    index = {f: i for i, f in enumerate(funcs)}
    t0 = min((r.start_ns for r in records), default=0)
    cols = np.array([(r.task, r.p, r.program, r.start_ns - t0, r.end_ns - t0, r.segment, index[r.func], r.sm)
                     for r in records], np.int64).reshape(-1, 8)
    np.savez_compressed(path, items=cols, funcs=np.array(funcs), programs=np.int64(programs))


def load(path: str) -> tuple[np.ndarray, list[str], int]:
    """``(items [n, 8]: task, p, program, start, end, segment, variant index, multiprocessor (-1:
    not known; a file saved before it was traced has none); variant names; programs)`` of a file
    :func:`save` wrote."""
    with np.load(path) as f:
        items = f["items"]
        if items.shape[1] == 7:
            items = np.concatenate([items, np.full((len(items), 1), -1, np.int64)], 1)
        return items, [str(x) for x in f["funcs"]], int(f["programs"])


def task_stats(items: np.ndarray) -> dict[int, dict]:
    """Per task: its variant index, items, programs, rounds, median item, span (first start to
    last end) and tail (its last end after the earliest end among the programs' last items of
    it: the time programs that had finished their share of the task waited for the rest)."""
    out = {}
    order = np.argsort(items[:, 0], kind="stable")
    tasks, starts = np.unique(items[order, 0], return_index=True)
    for t, rows in zip(tasks, np.split(order, starts[1:])):
        it = items[rows]
        progs, counts = np.unique(it[:, 2], return_counts=True)
        last = np.array([it[it[:, 2] == p, 4].max() for p in progs])
        dur = it[:, 4] - it[:, 3]
        out[int(t)] = {"func": int(it[0, 6]), "items": len(it), "programs": len(progs), "rounds": int(counts.max()),
                       "item_ns": float(np.median(dur)), "item90_ns": float(np.percentile(dur, 90)),
                       "span_ns": float(it[:, 4].max() - it[:, 3].min()), "tail_ns": float(last.max() - last.min()),
                       "skew_ns": float(it[:, 3].max() - it[:, 3].min()),
                       "slow_ns": float(dur.max() - np.median(dur)), "shared": shared_ratio(it, dur)}
    return out


def shared_ratio(it: np.ndarray, dur: np.ndarray) -> float | None:
    """The median duration of a task's items whose multiprocessor ran another of its items at the
    same time over that of those that ran alone on theirs (None: multiprocessors not known, or
    items of one kind only)."""
    sm = it[:, 7]
    if (sm < 0).any():
        return None
    # per multiprocessor, its items by start: one overlaps an earlier one where it starts before
    # the latest end among them, a later one where the next one starts before it ends (sorting,
    # not all pairs: a prefill task has thousands of items)
    order = np.lexsort((it[:, 3], sm))
    s, start, end = sm[order], it[order, 3], it[order, 4]
    first = np.r_[True, s[1:] != s[:-1]]
    group = np.cumsum(first) - 1
    big = int(end.max() - end.min()) + 1  # (offsets that keep the running maximum within a group)
    latest = np.maximum.accumulate(end - end.min() + group * big) - group * big + end.min()
    earlier = np.r_[False, ~first[1:] & (start[1:] < latest[:-1])]
    later = np.r_[~first[1:] & (start[1:] < end[:-1]), False]
    beside = np.empty(len(it), bool)
    beside[order] = earlier | later
    if beside.all() or not beside.any():
        return None
    return float(np.median(dur[beside]) / np.median(dur[~beside]))


def by_variant(stats: dict[int, dict], funcs: list[str]) -> list[dict]:
    """The tasks' statistics summed (spans, tails) or averaged (the rest) per variant, the
    largest total span first."""
    groups = defaultdict(list)
    for s in stats.values():
        groups[s["func"]].append(s)
    rows = []
    for f, ss in groups.items():
        shared = [s["shared"] for s in ss if s["shared"] is not None]
        rows.append({"variant": funcs[f], "tasks": len(ss),
                     **{k: float(np.mean([s[k] for s in ss])) for k in ("items", "programs", "rounds", "item_ns",
                                                                        "item90_ns")},
                     **{f"{k}_us": sum(s[f"{k}_ns"] for s in ss) / 1e3 for k in ("span", "tail", "skew", "slow")},
                     "shared": float(np.median(shared)) if shared else None})
    return sorted(rows, key=lambda r: -r["span_us"])


def report(path: str, top: int) -> list[str]:
    items, funcs, programs = load(path)
    stats = task_stats(items)
    rows = by_variant(stats, funcs)
    span = (items[:, 4].max() - items[:, 3].min()) / 1e3 if len(items) else 0.0
    lines = [f"{path}: {len(items):,} items, {len(stats):,} tasks, {programs} programs, span {span:.1f} us",
             f"  {'variant':44s} {'tasks':>5s} {'items':>7s} {'progs':>6s} {'rounds':>6s} {'item us':>8s} "
             f"{'p90 us':>7s} {'span us':>9s} {'tail us':>8s} {'skew us':>8s} {'slow us':>8s} {'shared':>6s}"]
    for r in rows[:top]:
        shared = "" if r["shared"] is None else f"{r['shared']:.2f}"
        lines.append(f"  {r['variant'][:44]:44s} {r['tasks']:5d} {r['items']:7.1f} {r['programs']:6.1f} "
                     f"{r['rounds']:6.2f} {r['item_ns'] / 1e3:8.2f} {r['item90_ns'] / 1e3:7.2f} {r['span_us']:9.1f} "
                     f"{r['tail_us']:8.1f} {r['skew_us']:8.1f} {r['slow_us']:8.1f} {shared:>6s}")
    return lines


def layer_timeline(items: np.ndarray, funcs: list[str], layers: int) -> tuple[list[dict], float]:
    """``(rows, layer span us)``: per variant of a layer (in the order its groups start), the
    medians over the middle layers (all of them below 3) of its group's gap, skew, span and ends,
    in us (the module docstring's ``--layers``)."""
    by_func = defaultdict(list)
    for t in np.unique(items[:, 0]):
        by_func[int(items[items[:, 0] == t, 6][0])].append(int(t))
    groups = []  # per layer: (func, first start, last start, first end, last end) of each group's items
    for layer in range(layers):
        row = []
        for f, ts in by_func.items():
            if len(ts) % layers:
                continue
            per = len(ts) // layers
            it = items[np.isin(items[:, 0], ts[layer * per:(layer + 1) * per])]
            row.append((f, float(it[:, 3].min()), float(it[:, 3].max()), float(it[:, 4].min()), float(it[:, 4].max())))
        groups.append(sorted(row, key=lambda g: g[1]))
    middle = range(1, layers - 1) if layers >= 3 else range(layers)
    acc = defaultdict(list)
    spans = []
    for layer in middle:
        prev = max(g[4] for g in groups[layer - 1]) if layer else None
        for f, s0, s1, e0, e1 in groups[layer]:
            acc[f].append((s0 - prev if prev is not None else np.nan, s1 - s0, e1 - s0, e1 - e0))
            prev = e1
        spans.append(max(g[4] for g in groups[layer]) - min(g[1] for g in groups[layer]))
    order = [g[0] for g in groups[middle[0]]] if len(middle) else []
    rows = [{"variant": funcs[f], **dict(zip(("gap_us", "skew_us", "span_us", "ends_us"),
                                             (float(np.nanmedian(col)) / 1e3 if not np.isnan(col).all() else None
                                              for col in np.array(acc[f], float).T)))} for f in order]
    return rows, float(np.median(spans)) / 1e3 if spans else 0.0


def timeline_report(path: str, layers: int) -> list[str]:
    items, funcs, _ = load(path)
    rows, span = layer_timeline(items, funcs, layers)
    lines = [f"{path}: a layer of {layers} (medians of the middle layers), span {span:.2f} us",
             f"  {'variant':44s} {'gap us':>7s} {'skew us':>8s} {'span us':>8s} {'ends us':>8s}"]
    for r in rows:
        gap = "" if r["gap_us"] is None else f"{r['gap_us']:.2f}"
        lines.append(f"  {r['variant'][:44]:44s} {gap:>7s} {r['skew_us']:8.2f} {r['span_us']:8.2f} {r['ends_us']:8.2f}")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+")
    ap.add_argument("--top", type=int, default=12, help="variants shown per file (the longest total span first)")
    ap.add_argument("--layers", type=int, default=0, help="a decode step's layers: also a layer's timeline")
    args = ap.parse_args(argv)
    if args.layers < 0:
        ap.error(f"--layers {args.layers}: a number of layers (0: no timeline)")
    for path in args.files:
        print("\n".join(report(path, args.top)))
        if args.layers:
            print("\n".join(timeline_report(path, args.layers)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
