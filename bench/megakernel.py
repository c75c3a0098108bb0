"""The persistent megakernel's design choices, measured on decode steps: milliseconds per token of
each choice against the wave executor in the same process (random weights of the real shapes,
bf16, one sequence unless ``--batches`` says more, the cache filled to half; a GPU).

    python bench/megakernel.py [--configs smollm2-135m,llama3.2-1b,llama3-8b] [--batches 1,8]
        [--cache 1024] [--variants 'd=static;d=stream,f=1;x=auto,s=2/0'] [--tilings 'default;waves;bn=8']
        [--steps 32] [--branches] [--budget SECONDS] [--json FILE]

A variant is comma-separated settings of the megakernel's environment: ``d=`` dispatch
(``PTO_DISPATCH``), ``f=`` 0, 1, 2 or light (``PTO_MK_PREFETCH``), ``k=`` the KiB an item prefetches
at most (``PTO_MK_PREFETCH_KB``), ``s=`` programs per multiprocessor
(``PTO_PER_SM``; one per segment of a split plan with ``/``: ``s=2/0``, 2 for the first segment,
as many as fit for the others), ``g=`` programs (``PTO_PROGRAMS``), ``x=`` the split into
launches by resource class (``PTO_MK_SPLIT``: ``off``, ``auto``, levels ``181/182``), ``e=`` the
early loads (``PTO_MK_EARLY``: ``graph``, ``preds``), ``r=`` runs (``PTO_MK_RUNS``: ``auto``, a
count, 0), ``w=`` what an item waits for (``PTO_MK_DEPS``: ``task``, ``data``), ``p=`` how it polls
(``PTO_MK_POLL``: ``one``, ``every``), ``i=`` inline items (``PTO_MK_INLINE``: ``off``, ``on``), ``a=``
when the next item's descriptor loads (``PTO_MK_AHEAD``: ``held``, ``after``), ``c=`` the branches'
calls (``PTO_MK_CALLS``: ``inline``, ``noinline``), ``t=`` where the strides come from
(``PTO_MK_STRIDES``: ``table``, ``constant``), e.g.
``d=static,f=1``. A tiling is ``default`` (the executor's own,
:func:`pto.orchestration.model.program.tiling_for_executor`), ``waves`` (the wave executor's) or
fields replaced in the wave executor's, as bench/decode.py takes them (``+FIELDS``: in the
executor's own). Each persistent run
reports its megakernel's items, median item gap and dependency wait, the critical path's time in
waits, items and spread (per InCore function on it, with its items and rounds: where a step's
latency goes), the item path's waits, dispatch gaps and items (the same, item by item;
``--records DIR`` also saves every item for ``python bench/records.py``), and per segment (one
unless split) its levels, items, branches, registers, spills, shared memory, warps and programs
per SM; ``--branches``: the first persistent run of each configuration and tiling also compiles
each branch alone in a one-branch megakernel (its registers, spills and shared memory against
the estimate the cut rule reads). The wave executor's rows list each compiled kernel's. Every
row is printed as a JSON line as soon as it is measured, and a table at the end.

The split's measurement (issue 45; one call on an H200, under 8 minutes)::

    python bench/megakernel.py --configs smollm2-135m,llama3.2-1b,llama3-8b \
        --variants 'x=off;x=auto;x=auto,s=2/0;x=auto,s=3/0' --branches --budget 330 --json mk_split.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from decode import copy_bandwidth, floor_ms, ours, parse_tiling, path_lines, settle_graphs, write_rows  # noqa: E402
from megakernel_sass import environment  # noqa: E402
from pto.orchestration.model.program import CONFIGS, random_weights, tiling_for, tiling_for_executor  # noqa: E402

#: the short names of a variant's settings
ENV = {"d": "PTO_DISPATCH", "f": "PTO_MK_PREFETCH", "k": "PTO_MK_PREFETCH_KB", "s": "PTO_PER_SM", "g": "PTO_PROGRAMS",
       "x": "PTO_MK_SPLIT", "e": "PTO_MK_EARLY", "r": "PTO_MK_RUNS", "w": "PTO_MK_DEPS", "p": "PTO_MK_POLL",
       "i": "PTO_MK_INLINE", "a": "PTO_MK_AHEAD", "c": "PTO_MK_CALLS", "t": "PTO_MK_STRIDES"}


def variant_env(variant: str) -> dict[str, str]:
    """The environment of a variant (``x=auto,s=2/0`` -> PTO_MK_SPLIT=auto, PTO_PER_SM=2,0)."""
    pairs = dict(kv.split("=") for kv in variant.split(",")) if variant else {}
    return {ENV[k]: v.replace("/", ",") for k, v in pairs.items()}


def records_path(folder: str | None, config: str, tiling_text: str, variant: str, batch: int = 1) -> str | None:
    """Where a run's traced items go (``--records``): CONFIG_TILING_VARIANT.npz in ``folder``
    (CONFIG-bBATCH from 2 sequences on), in letters, digits, dots and dashes (the device tool
    brings no other file names back)."""
    if not folder:
        return None
    os.makedirs(folder, exist_ok=True)
    config = config if batch == 1 else f"{config}-b{batch}"
    safe = "".join(ch if ch.isalnum() or ch in ".-" else "_" for ch in f"{config}_{tiling_text}_{variant or 'plain'}")
    return os.path.join(folder, f"{safe}.npz")


def tiling(text: str, cfg, executor: str):
    if text == "default":
        return tiling_for_executor(cfg, executor)
    return parse_tiling("default" if text == "waves" else text, tiling_for(cfg), tiling_for_executor(cfg, executor))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", default="smollm2-135m,llama3.2-1b,llama3-8b")
    ap.add_argument("--batches", default="1", help="sequences a step (comma-separated: each configuration at each)")
    ap.add_argument("--cache", type=int, default=1024)
    ap.add_argument("--variants", default="d=static;d=stream")
    ap.add_argument("--tilings", default="default")
    ap.add_argument("--waves", default="default", help="tilings the wave executor runs ('' none)")
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--branches", action="store_true",
                    help="compile each branch alone once per configuration and tiling (registers, spills, shared "
                         "memory)")
    ap.add_argument("--budget", type=float, default=None,
                    help="seconds after which no further run starts (each is skipped, said in its line): the rows "
                         "measured so far and the table still print within a call's time limit")
    ap.add_argument("--json", default=None)
    ap.add_argument("--settle", action="store_true",
                    help="make three throwaway CUDA graphs first (bench/decode.py's settle_graphs): the wave "
                         "executor's rows all timed in the state a process reaches at its fourth graph")
    ap.add_argument("--records", default=None,
                    help="a folder for each persistent run's traced items (CONFIG_TILING_VARIANT.npz), to study off "
                         "the GPU with bench/records.py")
    args = ap.parse_args(argv)
    start = time.perf_counter()
    bw = copy_bandwidth()
    if args.settle:
        settle_graphs()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(f"copy bandwidth {bw / 1e12:.2f} TB/s on {torch.cuda.get_device_name(0)}, {sms} SMs", flush=True)
    rows = []
    batches = [int(b) for b in args.batches.split(",")]
    for name in args.configs.split(","):
        cfg = CONFIGS[name]
        w = random_weights(cfg, torch.bfloat16, torch.Generator(device="cuda").manual_seed(0))
        runs = [(b, "waves", t, "") for b in batches for t in args.waves.split(";") if t]
        runs += [(b, "persistent", t, v) for b in batches for t in args.tilings.split(";")
                 for v in args.variants.split(";")]
        alone = set()  # the (batch, tiling) pairs whose branches were compiled alone
        for batch, executor, tl, variant in runs:
            base = {"config": name, "batch": batch, "cache": args.cache,
                    "floor_ms": floor_ms(cfg, batch, args.cache, bw)}
            if args.budget and time.perf_counter() - start > args.budget:
                print(json.dumps({**base, "executor": executor, "tiling": tl, "variant": variant,
                                  "skipped": f"past --budget {args.budget} s"}), flush=True)
                continue
            branches = args.branches and executor == "persistent" and (batch, tl) not in alone
            if branches:
                alone.add((batch, tl))
            try:
                with environment(variant_env(variant)):
                    res = ours(w, batch, args.cache, executor, args.steps, tiling(tl, cfg, executor),
                               branches=branches, records=records_path(args.records, name, tl, variant, batch)
                               if executor == "persistent" else None)
            except Exception as e:  # report it, measure the rest
                res = {"error": f"{type(e).__name__}: {str(e)[:400]}"}
            row = {**base, "executor": executor, "tiling": tl, "variant": variant, **res}
            if "ms" in res:
                row["x_floor"] = round(base["floor_ms"] / res["ms"], 3)
            rows.append(row)
            print(json.dumps(row), flush=True)
            torch.cuda.empty_cache()
        del w
        torch.cuda.empty_cache()
    if args.json:
        write_rows(args.json, bw, rows)
    for r in rows:
        print(table_lines(r))
    return 0


def table_lines(r: dict) -> str:
    """A row as text: its time and the megakernel's items, gap and wait; a line per segment
    (registers, spills, shared memory, warps, programs a multiprocessor, branches) and per branch
    compiled alone; the wave executor's kernels with the most registers."""
    what = r["executor"] + (f" [{r['variant']}]" if r["variant"] else "") + f" tiling {r['tiling']}"
    rep = r.get("report", {})
    config = r["config"] if r.get("batch", 1) == 1 else f"{r['config']} B={r['batch']}"
    lines = [f"{config:14s} {what:44s} {r.get('ms', r.get('error'))} ms  floor {r['floor_ms']}  "
             f"items {rep.get('items', '')} gap {rep.get('item_gap_us', '')} wait {rep.get('dependency_wait_us', '')}"]
    lines += path_lines(rep, functions=8)
    segments = rep.get("segments", [rep] if "regs" in rep else [])
    if "split" in rep:
        lines.append(f"    split: {rep['split']}")
    for k, seg in enumerate(segments):
        where = f"levels {seg['levels'][0]}-{seg['levels'][1]}, {seg['items']} items, " if "levels" in seg else ""
        lines.append(f"    segment {k}: {where}regs {seg.get('regs')} spills {seg.get('spills')} smem "
                     f"{seg.get('shared')} warps {seg.get('warps')} per_sm {seg.get('programs_per_sm')}"
                     + (f"  [{', '.join(seg['branches'])}]" if isinstance(seg.get("branches"), list) else ""))
    for b in r.get("branches", []):
        lines.append(f"    alone {b['branch'][:48]:48s} regs {b.get('regs')} spills {b.get('spills')} smem "
                     f"{b.get('shared')} warps {b.get('warps')} per_sm {b.get('programs_per_sm')} "
                     f"estimate {b['estimate_per_sm']}")
    top = sorted(r.get("compiled", []), key=lambda c: -c["regs"])[:6]
    lines += [f"    kernel {c['kernel'][:48]:48s} regs {c['regs']} spills {c['spills']} smem {c['shared']} "
              f"warps {c['warps']} stages {c['stages']}" for c in top]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
