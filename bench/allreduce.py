"""The sum over the ranks by algorithm and message size: where symmetric memory's one-shot and
two-shot all-reduce beat NCCL's, on this machine and rank count (pto.collectives' limits).

    torchrun --nproc-per-node 2 bench/allreduce.py [--sizes 4K,16K,...,64M] [--json FILE]

For each size (bytes each rank sends, bf16) and algorithm (``one_shot`` and ``two_shot`` where
symmetric memory runs, ``group``: the process group's, NCCL), the microseconds of one sum,
replayed from a CUDA graph of ``--calls`` sums (no launch cost, as a decode step replays them),
the slowest rank's median over ``--replays``; each algorithm's sum checked first (every rank's
buffer holds its rank + 1: the sum is exact). Rank 0 prints a markdown table, the fastest
algorithm per size and the limits ``PTO_COLLECTIVES=auto`` would take from them (the largest
size each symmetric algorithm wins at: ``PTO_ONE_SHOT_MAX``, ``PTO_TWO_SHOT_MAX``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pto import collectives, dist  # noqa: E402

SIZES = "4K,8K,16K,32K,64K,128K,256K,512K,1M,2M,4M,8M,16M,64M"


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)


def time_us(fn, calls: int, replays: int) -> float:
    """Microseconds per call of ``fn``: ``calls`` of it captured in a CUDA graph, the median of
    ``replays`` replays (CUDA events)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    times = []
    for _ in range(replays):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        dist.barrier()
        a.record()
        graph.replay()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / calls)
    return statistics.median(times)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default=SIZES)
    ap.add_argument("--calls", type=int, default=20, help="sums per captured graph")
    ap.add_argument("--replays", type=int, default=20)
    ap.add_argument("--json", default=None, metavar="FILE")
    args = ap.parse_args(argv)
    env = dist.environment()
    tp = env.world if env else 1
    rank = dist.init("cuda", tp, command="bench/allreduce.py")
    symm = collectives.symmetric_memory()
    algorithms = [collectives.ONE_SHOT, collectives.TWO_SHOT] if symm.usable else []
    algorithms.append(collectives.GROUP)
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    dev, dt = torch.device("cuda", torch.cuda.current_device()), torch.bfloat16
    pool = collectives.SumBuffers()  # the largest first: one symmetric allocation, views of its front
    big = max(sizes) // 2
    if symm.usable:
        pool.get(big, dt, dev, symmetric=True)
    pool.get(big, dt, dev)
    rows = []
    for size in sizes:
        n = size // 2
        row = {"bytes": size}
        for how in algorithms:
            send = pool.get(n, dt, dev, symmetric=how != collectives.GROUP)
            recv = pool.get(n, dt, dev) if how == collectives.ONE_SHOT else send
            send.fill_(rank + 1)
            collectives.all_reduce(send, recv, how)
            want = tp * (tp + 1) // 2
            if not bool((recv == want).all()):
                raise SystemExit(f"{how} at {size} bytes: the sum is not {want} on rank {rank}")
            us = time_us(lambda s=send, r=recv, h=how: collectives.all_reduce(s, r, h), args.calls, args.replays)
            row[how] = round(max(dist.gather(us)), 2)
        row["fastest"] = min(algorithms, key=lambda a: row[a])
        rows.append(row)
    if rank == 0:
        cells = [["bytes", *algorithms, "fastest"], ["---"] * (len(algorithms) + 2)]
        cells += [[str(r["bytes"]), *(f"{r[a]:.1f}" for a in algorithms), r["fastest"]] for r in rows]
        print("\n".join("| " + " | ".join(c) + " |" for c in cells))
        limits = {a: max((r["bytes"] for r in rows if r["fastest"] == a), default=0) for a in algorithms}
        print(f"tp {tp}; symmetric memory: {'yes' if symm.usable else 'no (' + symm.why + ')'}; "
              f"the largest size each wins at (bytes): {limits}")
        if args.json:
            Path(args.json).write_text(json.dumps({
                "device": torch.cuda.get_device_name(), "tp": tp, "torch": torch.__version__,
                "symmetric_memory": symm.usable, "why": symm.why, "collectives": collectives.info(),
                "nccl_env": {k: os.environ.get(k) for k in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST")},
                "rows": rows, "wins_up_to": limits}, indent=1))
    dist.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
