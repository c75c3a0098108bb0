"""Tensor parallelism of the LLaMA layer: ours against tp = 1 and against a plain PyTorch
tensor-parallel layer, time, scaling efficiency and the share of time in communication.

One launch per tensor-parallel width, the width being the launch's world size (pto's ``--tp``
splits over the default process group, all of it)::

    for n in 2 4 8; do torchrun --nproc-per-node $n bench/tp.py --json tp$n.json; done

Each launch, at each sequence length (default 4K, 16K, 32K; the 7B layer in bf16, LLaMA-2-7B's
shape), on the same seeded inputs:

- ours: the engine's Runner of ``llama7b --tp N`` on every rank (each its shard,
  :meth:`LlamaProgram.shard`), timed as replays; rank 0 also runs the single-process layer
  (``--tp 1``) on the whole inputs: the tp = 1 output and time;
- PyTorch: the same layer written by hand with Megatron's split (bench/torch_tp.py: q, k, v,
  gate, up by columns, o and down by rows, ``torch.distributed.all_reduce`` after each), and the
  same code with one rank on rank 0;
- the reference: ``pto run --check``'s layer on the whole inputs in float32 (rank 0).

Ours runs under each ``--collectives`` mode (``PTO_COLLECTIVES``: ``auto``, the sums by size,
symmetric memory's one-shot or two-shot all-reduce where it runs and the message is small;
``group``, NCCL for every sum) and each ``--chunks`` count (``PTO_COLLECTIVE_CHUNKS``: the parts
a batch's sum goes in, each overlapping the next part's products: more ranks, the same bytes to
sum over less compute), the first variant's numbers the table's columns, every variant's in a
second table (time, efficiency, the collectives' time per step, share and overlap, the first
run's sums by algorithm).

Reported per length: milliseconds (the slowest rank's median), scaling efficiency ``t1 / (N tN)``
for ours and for PyTorch, the share of a step spent in communication and how much of the
communication overlaps compute (from a profiler trace of a few steps: NCCL kernels against the
others on a GPU, the all-reduce calls on the CPU), pto's collective counters (host calls: a
step replayed as a CUDA graph makes none), how the replays ran (``replay_mode``) and how far a
replay is from the first run (``replay_vs_first``), and relative errors (ours against tp = 1,
against PyTorch's TP layer, each against the f32 reference); in ``--json`` also rank 0's longest
kernels per step (``ours_kernels``, ``ours_tp1_kernels``, ``torch_kernels``).
``--trace-dir DIR`` keeps rank 0's Chrome traces. Output: a markdown table (docs/PERF.md) and
``--json FILE`` (rank 0 writes both).

``--tiny`` runs the tiny layer at 100 and 300 tokens on the CPU with gloo, in f32::

    torchrun --nproc-per-node 2 bench/tp.py --tiny
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from pathlib import Path

# the single-process run on rank 0 (a cold Triton compile of the 7B layer) keeps the other ranks
# waiting in a barrier: longer than pto.dist's default timeout allows
os.environ.setdefault("PTO_DIST_TIMEOUT_S", "3600")

import torch  # noqa: E402
from torch_tp import torch_tp_layer  # noqa: E402  (bench/torch_tp.py, beside this script)

from pto import dist  # noqa: E402
from pto.timing import comm_profile  # noqa: E402

# -- the measurement ------------------------------------------------------------------------------


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    o, r = out.double(), ref.double()
    return float((o - r).norm() / r.norm()) if torch.isfinite(o).all() else float("inf")


def _time(fn, args, cuda: bool) -> float:
    from pto.timing import median_ms

    dist.barrier()
    return round(median_ms(fn, args.iterations, args.warmup, cuda=cuda), 4)


def _ours(job, seq: int, local: dict, args, cuda: bool, variant: tuple[str, str], trace) -> tuple[dict, torch.Tensor]:
    """pto's layer on this rank's shard with the collectives of ``variant`` (``PTO_COLLECTIVES``,
    ``PTO_COLLECTIVE_CHUNKS``): its replay time, communication profile, the sums of its first run
    by algorithm, how replays run and how far a replay is from the first run; and the first run's
    output."""
    from pto.engine import Runner

    # read when the collective launches are prepared (the first run)
    os.environ["PTO_COLLECTIVES"], os.environ["PTO_COLLECTIVE_CHUNKS"] = variant
    runner = Runner(job, seq)
    dist.counters(reset=True)
    first = runner(local)["y"].clone()
    got = {"tasks": runner.graph.tasks, "executor": runner.executor.name, "collectives": dist.counters(reset=True),
           "ours_ms": _time(runner.replay, args, cuda)}
    prof = comm_profile(runner.replay, args.profile_steps, cuda, trace)
    got.update({f"ours_{k}": v for k, v in prof.items()})
    # how replays run (a CUDA graph with the collectives inside, where they can be captured), and
    # that a replay computes the first run's bits
    got["replay_mode"] = runner.replay()
    got["replay_vs_first"] = rel_err(runner.tensors["y"], first)
    runner.close()
    return got, first


def measure(seq: int, args, device: str, tp: int, rank: int) -> dict:
    from pto.engine import Runner, resolve

    cuda = device == "cuda"
    options = {"attention": args.attention, "allreduce_dtype": args.allreduce_dtype}
    job = resolve("llama7b", device=device, config=args.config, dtype=args.dtype, options=options, tp=tp)
    prog, s = job.program, job.settings
    cfg = prog.config(s)
    inputs = prog.inputs(s, prog.shape(seq), device, args.seed)  # every rank the whole seeded inputs
    local = prog.shard(s, inputs, rank)
    row = {"seq": seq, "tp": tp, "config": s.config, "dtype": s.dtype.short, **options}
    trace = Path(args.trace_dir) if args.trace_dir and rank == 0 else None
    if trace:
        trace.mkdir(parents=True, exist_ok=True)

    variants = [(m, c) for m in args.collectives.split(",") for c in args.chunks.split(",")]
    mine: dict = {"modes": {}}
    for i, (mode, chunks) in enumerate(variants):  # the first variant's numbers are the row's "ours_*"
        key = f"{mode}, {chunks} chunks"
        got, out = _ours(job, seq, local, args, cuda, (mode, chunks),
                         trace and trace / f"ours_{mode}_{chunks}_seq{seq}_rank0.json")
        mine["modes"][key] = got
        if i == 0:
            ours = out
            mine.update({k: v for k, v in got.items() if k not in ("tasks", "executor")})
            row["tasks_per_rank"], row["executor"] = got["tasks"], got["executor"]

    theirs = torch_tp_layer(local, cfg, tp)
    mine["torch_ms"] = _time(lambda: torch_tp_layer(local, cfg, tp), args, cuda)
    prof = comm_profile(lambda: torch_tp_layer(local, cfg, tp), args.profile_steps, cuda,
                        trace and trace / f"torch_seq{seq}_rank0.json")
    mine.update({f"torch_{k}": v for k, v in prof.items()})
    ranks = dist.gather(mine)

    if rank == 0:  # the single-process runs and the reference, while the other ranks wait
        from pto.timing import median_ms

        job1 = resolve("llama7b", device=device, config=args.config, dtype=args.dtype, options=options, tp=1)
        r1 = Runner(job1, seq)
        one = r1(inputs)["y"].clone()
        row["ours_tp1_ms"] = round(r1.time(args.iterations)["replay_ms"], 4)
        row["ours_tp1_kernels"] = comm_profile(r1.replay, args.profile_steps, cuda)["kernels"]
        r1.close()
        del r1
        torch_one = torch_tp_layer(inputs, cfg, 1)
        row["torch_tp1_ms"] = round(median_ms(lambda: torch_tp_layer(inputs, cfg, 1), args.iterations, args.warmup,
                                              cuda=cuda), 4)
        ref = prog.reference(job1.settings, prog.shape(seq), {k: v.float() for k, v in inputs.items()})["y"]
        row.update(ours_ms=max(r["ours_ms"] for r in ranks), torch_ms=max(r["torch_ms"] for r in ranks))
        row["ours_efficiency"] = round(row["ours_tp1_ms"] / (tp * row["ours_ms"]), 4)
        row["torch_efficiency"] = round(row["torch_tp1_ms"] / (tp * row["torch_ms"]), 4)
        row["ours_vs_torch_tp"] = round(row["torch_ms"] / row["ours_ms"], 4)
        for who in ("ours", "torch"):
            for k in ("comm_share", "overlap", "comm_ms_per_step"):
                row[f"{who}_{k}"] = max(r[f"{who}_{k}"] for r in ranks)
            row[f"{who}_kernels"] = ranks[0][f"{who}_kernels"]
        row.update(ours_rel_err=rel_err(ours, ref), ours_tp1_rel_err=rel_err(one, ref),
                   torch_tp_rel_err=rel_err(theirs, ref), torch_tp1_rel_err=rel_err(torch_one, ref),
                   ours_vs_tp1=rel_err(ours, one), ours_vs_torch_tp_out=rel_err(ours, theirs))
        row["replay_mode"] = ranks[0]["replay_mode"]
        row["replay_vs_first"] = max(r["replay_vs_first"] for r in ranks)
        # every mode: the slowest rank's time and communication, its efficiency, its sums' algorithms
        row["modes"] = {}
        for m in ranks[0]["modes"]:
            slowest = max(r["modes"][m]["ours_ms"] for r in ranks)
            row["modes"][m] = {"ms": slowest, "efficiency": round(row["ours_tp1_ms"] / (tp * slowest), 4),
                               **{k: max(r["modes"][m][f"ours_{k}"] for r in ranks)
                                  for k in ("comm_share", "overlap", "comm_ms_per_step")},
                               "algorithms": ranks[0]["modes"][m]["collectives"]["algorithms"]}
        row["ranks"] = ranks
    dist.barrier()
    if cuda:
        torch.cuda.empty_cache()
    return row


#: the table's columns: header, the row's key, its format
COLUMNS = (("tp", "tp", "{}"), ("seq", "seq", "{}"), ("ours ms", "ours_ms", "{:.3f}"),
           ("tp=1 ms", "ours_tp1_ms", "{:.3f}"), ("efficiency", "ours_efficiency", "{:.2f}"),
           ("comm share", "ours_comm_share", "{:.1%}"), ("overlap", "ours_overlap", "{:.1%}"),
           ("PyTorch TP ms", "torch_ms", "{:.3f}"), ("PyTorch tp=1 ms", "torch_tp1_ms", "{:.3f}"),
           ("PyTorch efficiency", "torch_efficiency", "{:.2f}"), ("PyTorch comm share", "torch_comm_share", "{:.1%}"),
           ("rel_err ours", "ours_rel_err", "{:.2e}"), ("rel_err vs tp=1", "ours_vs_tp1", "{:.2e}"))


def table(rows: list[dict]) -> str:
    """Markdown, for docs/PERF.md: the first mode's row per length, then every mode's."""
    cells = [[h for h, _, _ in COLUMNS], ["---"] * len(COLUMNS)]
    cells += [[f.format(r[k]) for _, k, f in COLUMNS] for r in rows]
    modes = [["tp", "seq", "collectives", "ms", "efficiency", "comm ms/step", "comm share", "overlap", "sums"],
             ["---"] * 9]
    modes += [[str(r["tp"]), str(r["seq"]), m, f"{v['ms']:.3f}", f"{v['efficiency']:.2f}",
               f"{v['comm_ms_per_step']:.3f}", f"{v['comm_share']:.1%}", f"{v['overlap']:.1%}",
               " ".join(f"{k} {n}" for k, n in sorted(v["algorithms"].items()))]
              for r in rows for m, v in r["modes"].items()]
    return "\n\n".join("\n".join("| " + " | ".join(c) + " |" for c in t) for t in (cells, modes))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seq", default=None, help="comma-separated lengths (default 4096,16384,32768; --tiny 100,300)")
    p.add_argument("--tiny", action="store_true", help="the tiny layer in f32 on the CPU (gloo)")
    p.add_argument("--config", default=None, help="the layer (default: 7b, LLaMA-2-7B's shape; --tiny: tiny)")
    p.add_argument("--dtype", default=None, help="default bf16 (--tiny: f32)")
    p.add_argument("--attention", default="fused", choices=["fused", "pair", "split"])
    p.add_argument("--allreduce-dtype", default="storage", choices=["storage", "f32"])
    p.add_argument("--collectives", default="auto,group",
                   help="PTO_COLLECTIVES modes to measure ours under, comma-separated; the first is the table's "
                   "(default auto,group: by size, symmetric memory's for small sums; NCCL for all)")
    p.add_argument("--chunks", default=os.environ.get("PTO_COLLECTIVE_CHUNKS", "4"),
                   help="PTO_COLLECTIVE_CHUNKS values to measure each mode with, comma-separated (default 4: a "
                   "batch's sums in 4 parts, each overlapping the next part's products)")
    p.add_argument("--iterations", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--profile-steps", type=int, default=3, help="steps under the profiler (communication share)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--trace-dir", default=None, help="keep rank 0's Chrome traces here")
    p.add_argument("--max-rel-err", type=float, default=None,
                   help="exit 1 when ours is further than this from the reference (default: 2e-2 in bf16, "
                   "1e-4 in f32)")
    p.add_argument("--json", default=None, metavar="FILE")
    args = p.parse_args(argv)
    args.config = args.config or ("tiny" if args.tiny else "7b")
    args.dtype = args.dtype or ("f32" if args.tiny else "bf16")
    device = "cpu" if args.tiny or not torch.cuda.is_available() else "cuda"
    seqs = [int(v) for v in (args.seq or ("100,300" if args.tiny else "4096,16384,32768")).split(",")]
    env = dist.environment()
    tp = env.world if env else 1
    rank = dist.init(device, tp, command="bench/tp.py")
    rows = []
    for seq in seqs:
        row = measure(seq, args, device, tp, rank)
        if rank == 0:
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "ranks"}), file=sys.stderr, flush=True)
    limit = args.max_rel_err or (2e-2 if args.dtype == "bf16" else 1e-4)
    bad = [r for r in rows if r["ours_rel_err"] > limit]
    if rank == 0:
        info = {"device": torch.cuda.get_device_name() if device == "cuda" else platform.processor() or "cpu",
                "world_size": tp, "torch": torch.__version__, "backend": "nccl" if device == "cuda" else "gloo",
                "iterations": args.iterations, "warmup": args.warmup, "tiny": args.tiny,
                "nccl_env": {k: os.environ.get(k) for k in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST")}}
        print(table(rows))
        if args.json:
            Path(args.json).write_text(json.dumps({"info": info, "rows": rows}, indent=1))
        for r in bad:
            print(f"tp: seq {r['seq']}: rel_err {r['ours_rel_err']:.2e} above {limit:g}", file=sys.stderr)
    dist.shutdown()
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
