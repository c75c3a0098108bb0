"""Where the layer's time goes, against torch.compile (issue 23): the kernels of one run of pto's
task graph and of the torch.compile'd reference, recorded by the PyTorch profiler (CUPTI), summed
into matrix products, attention and everything else, beside each side's time per run.

    python3 bench/gap.py [--program llama7b] [--config 7b] [--seq 1537,16384] [--json F]

A kernel is a matrix product when its name says so (pto: ``matmul``; torch: cuBLAS's and CUTLASS's
``gemm``, ``nvjet``, ``xmma``, ``cutlass``), attention (pto: ``flash``; torch: ``flash``, ``fmha``,
``attention``, ``cudnn``; never torch.compile's generated ``triton_`` kernels, whose names list
the operations they fuse, SDPA's layout among them), else the rest (norms, RoPE, element-wise;
pto's products carry the residual and SwiGLU in their epilogues, torch.compile's Triton kernels
carry them apart). Our graph runs its launches without the CUDA graph here (kernel times are the
same; the "per run" column is the CUDA graph's replay, timed alone). Each side's ten largest
kernels are printed, so that the classification can be checked.
"""

from __future__ import annotations

import argparse
import json
import re

import torch

from pto.engine import Runner, rel_err, resolve
from pto.exec.timing import kernel_times, median_ms

KINDS = (("gemm", re.compile(r"matmul|gemm|nvjet|xmma|cutlass", re.I)),
         ("attention", re.compile(r"flash|fmha|attention|cudnn", re.I)))


def kind(name: str) -> str:
    if name.startswith("triton_"):  # torch.compile's own kernels: element-wise, whatever ops they name
        return "other"
    return next((k for k, rx in KINDS if rx.search(name)), "other")


def kernels(fn, reps: int) -> dict[str, float]:
    """Milliseconds per run of each kernel name (summed over its launches; memory copies and sets
    left out), ``reps`` runs (:func:`pto.exec.timing.kernel_times`)."""
    per, _ = kernel_times(fn, reps)
    return {name: ms for name, (_, ms) in per.items() if not name.startswith(("Memcpy", "Memset"))}


def summary(ks: dict[str, float]) -> dict[str, float]:
    s = {"gemm": 0.0, "attention": 0.0, "other": 0.0}
    for name, ms in ks.items():
        s[kind(name)] += ms
    s["kernels"] = sum(ks.values())
    return {k: round(v, 4) for k, v in s.items()}


def row(args, seq: int) -> dict:
    job = resolve(args.program, device="cuda", config=args.config, dtype="bf16", executor="waves")
    prog, s = job.program, job.settings
    shape = prog.shape(seq)
    inputs = prog.inputs(s, shape, "cuda", 0)
    ref = prog.reference(s, shape, inputs)
    runner = Runner(job, shape)
    try:
        err = max(rel_err(v, ref[k]) for k, v in runner(inputs).items())
        ours = kernels(runner.executor.replay, args.reps)
        ours_ms = median_ms(runner.replay, 20, 3)
    finally:
        runner.close()
    torch._dynamo.reset()
    comp = torch.compile(lambda x: prog.reference(s, shape, x), dynamic=False)
    theirs = kernels(lambda: comp(inputs), args.reps)
    theirs_ms = median_ms(lambda: comp(inputs), 20, 3)
    return {"seq": seq, "rel_err": err, "pto_ms": round(ours_ms, 4), "compile_ms": round(theirs_ms, 4),
            "pto": summary(ours), "compile": summary(theirs),
            "pto_kernels": dict(sorted(ours.items(), key=lambda kv: -kv[1])[:10]),
            "compile_kernels": dict(sorted(theirs.items(), key=lambda kv: -kv[1])[:10])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--program", default="llama7b")
    ap.add_argument("--config", default="7b")
    ap.add_argument("--seq", default="1537,16384")
    ap.add_argument("--reps", type=int, default=5, help="profiled runs (default 5)")
    ap.add_argument("--json")
    args = ap.parse_args()
    rows = []
    print(f"{args.program} {args.config} on {torch.cuda.get_device_name(0)}, ms per run", flush=True)
    print("seq | side | per run | kernels | gemm | attention | other", flush=True)
    for seq in (int(x) for x in args.seq.split(",")):
        r = row(args, seq)
        rows.append(r)
        for side in ("pto", "compile"):
            k = r[side]
            print(f"{seq} | {side} | {r[f'{side}_ms']:.3f} | {k['kernels']:.3f} | {k['gemm']:.3f} | "
                  f"{k['attention']:.3f} | {k['other']:.3f}", flush=True)
        for side in ("pto", "compile"):
            for name, ms in r[f"{side}_kernels"].items():
                print(f"    {side} {ms:.3f} {kind(name)} {name[:110]}", flush=True)
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1)


if __name__ == "__main__":
    main()
