"""Sweep tile shapes and launch parameters of the LLaMA layer's heavy InCore functions on the GPU.

For each candidate: build the InCore function with the tile sizes, run one batch covering every
row tile of a ``--seq`` long layer through the Triton backend with the launch parameters, check
the output against torch, time it (CUDA events, median), and print TFLOP/s. The best config per
function goes to the JSON (``--json``); the program's tiling for the cuda_h100 target and the
backend's launch table are set from it by hand, with the numbers in docs/PERF.md.

    python bench/tune_kernels.py --seq 16384 --json tune.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from pto.incore.attention import flash_fused  # noqa: E402
from pto.incore.matmul import matmul_swiglu_tile, matmul_tile  # noqa: E402

from pto.backends.triton import TritonBackend  # noqa: E402
from pto.data.batch import RegionBatch, TaskBatch  # noqa: E402
from pto.exec.timing import median_ms  # noqa: E402
from pto.ir.analysis import specialize  # noqa: E402
from pto.ir.dtypes import DType  # noqa: E402

BF16 = DType.BF16
# (bn, bk, num_warps, num_stages, GROUP): around the usual Hopper GEMM shapes and program orders
MATMUL_CONFIGS = [(256, 64, 8, 4, 0), (256, 64, 8, 4, 4), (256, 64, 8, 4, 8), (256, 64, 8, 4, 16),
                  (128, 64, 4, 3, 8), (256, 64, 8, 3, 8)]
# (tq, tk, num_warps, num_stages)
FLASH_CONFIGS = [(128, 128, 8, 3, 0), (128, 128, 8, 3, 1), (128, 128, 8, 3, 4), (128, 128, 8, 4, 0),
                 (128, 64, 8, 4, 0)]
# matmul_swiglu_tile (bn per projection, bk, num_warps, num_stages)
SWIGLU_CONFIGS = [(128, 64, 8, 3, 8), (128, 64, 8, 4, 8), (128, 64, 8, 4, 0)]


def regions(t: torch.Tensor, n: int, row0, col0, rows, cols) -> RegionBatch:
    """The regions of ``n`` tasks on ``t`` (each field an int or a per-task vector)."""

    def vec(v):
        return torch.as_tensor(v, dtype=torch.int64).expand(n).clone() if not torch.is_tensor(v) else v

    return RegionBatch(t, vec(row0), vec(col0), vec(rows), vec(cols))


def measure(kind: str, config: dict, flops: float, out: torch.Tensor, ref: torch.Tensor, build) -> dict:
    """Prepare a launch with ``build()``, check what it writes into ``out`` against ``ref``, time
    it; one result row (with ``error`` when the config does not compile or fit)."""
    label = f"{kind} " + " ".join(f"{k}={v}" for k, v in config.items())
    try:
        launch = build()
        out.fill_(float("nan"))
        launch()
        err = ((out.float() - ref).norm() / ref.norm()).item()
        ms = median_ms(launch)
    except Exception as e:  # a config that does not compile or fit is reported and skipped
        print(f"{label}: {type(e).__name__}: {str(e)[:300]}", flush=True)
        return {**config, "error": str(e)[:300]}
    tf = flops / ms / 1e9
    print(f"{label}: {ms:.3f} ms {tf:.0f} TF/s err {err:.1e}", flush=True)
    return {**config, "ms": round(ms, 4), "tflops": round(tf, 1), "rel_err": err}


def _launch_config(name: str, warps: int, stages: int, group: int) -> TritonBackend:
    return TritonBackend("cuda", launch={name: {"num_warps": warps, "num_stages": stages, "GROUP": group}})


def tune_matmul(seq: int, K: int, N: int, rows: int) -> list[dict]:
    x = torch.randn(seq, K, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(K, N, device="cuda", dtype=torch.bfloat16) * K ** -0.5
    y = torch.empty(seq, N, device="cuda", dtype=torch.bfloat16)
    ref = x.float() @ w.float()
    starts = torch.arange(0, seq, rows, dtype=torch.int64)
    n = len(starts)
    out = []
    for bn, bk, warps, stages, group in MATMUL_CONFIGS:
        def build(bn=bn, bk=bk, warps=warps, stages=stages, group=group):
            fn = specialize(matmul_tile(BF16, rows, K, N, bn, bk))
            mems = {"x": regions(x, n, starts, 0, rows, K), "w": regions(w, n, 0, 0, K, N),
                    "y": regions(y, n, starts, 0, rows, N)}
            return _launch_config("matmul_tile", warps, stages, group).prepare(TaskBatch(fn, mems, {}, n))

        config = dict(K=K, N=N, bn=bn, bk=bk, warps=warps, stages=stages, group=group)
        out.append(measure("matmul", config, 2 * seq * K * N, y, ref, build))
    return out


def tune_swiglu(seq: int, K: int = 4096, N: int = 11008, rows: int = 128) -> list[dict]:
    x = torch.randn(seq, K, device="cuda", dtype=torch.bfloat16)
    wg = torch.randn(K, N, device="cuda", dtype=torch.bfloat16) * K ** -0.5
    wu = torch.randn(K, N, device="cuda", dtype=torch.bfloat16) * K ** -0.5
    y = torch.empty(seq, N, device="cuda", dtype=torch.bfloat16)
    ref = torch.nn.functional.silu((x @ wg).float()) * (x @ wu).float()
    starts = torch.arange(0, seq, rows, dtype=torch.int64)
    n = len(starts)
    out = []
    for bn, bk, warps, stages, group in SWIGLU_CONFIGS:
        def build(bn=bn, bk=bk, warps=warps, stages=stages, group=group):
            fn = specialize(matmul_swiglu_tile(BF16, rows, K, N, bn, bk))
            mems = {"x": regions(x, n, starts, 0, rows, K), "wg": regions(wg, n, 0, 0, K, N),
                    "wu": regions(wu, n, 0, 0, K, N), "y": regions(y, n, starts, 0, rows, N)}
            return _launch_config("matmul_swiglu_tile", warps, stages, group).prepare(TaskBatch(fn, mems, {}, n))

        config = dict(bn=bn, bk=bk, warps=warps, stages=stages, group=group)
        out.append(measure("swiglu", config, 4 * seq * K * N, y, ref, build))
    return out


def tune_flash(seq: int, heads: int = 32, d: int = 128) -> list[dict]:
    H = heads * d
    q, k, v = (torch.randn(seq, H, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    o = torch.empty(seq, H, device="cuda", dtype=torch.bfloat16)
    qh, kh, vh = (t.view(seq, heads, d).transpose(0, 1)[None] for t in (q, k, v))
    ref = torch.nn.functional.scaled_dot_product_attention(qh, kh, vh, is_causal=True)[0]
    ref = ref.transpose(0, 1).reshape(seq, H).float()
    sdpa_ms = median_ms(lambda: torch.nn.functional.scaled_dot_product_attention(qh, kh, vh, is_causal=True))
    flops = 4 * seq * seq * H * 0.5
    print(f"sdpa causal seq={seq}: {sdpa_ms:.3f} ms {flops / sdpa_ms / 1e9:.0f} TF/s", flush=True)
    out = [{"sdpa_ms": round(sdpa_ms, 4), "sdpa_tflops": round(flops / sdpa_ms / 1e9, 1)}]
    for tq, tk, warps, stages, group in FLASH_CONFIGS:
        def build(tq=tq, tk=tk, warps=warps, stages=stages, group=group):
            fn = specialize(flash_fused(BF16, heads, d, tq, tk))
            starts = torch.arange(0, seq, tq, dtype=torch.int64)
            ends = torch.clamp(starts + tq, max=seq)
            nfull = (starts // tk) * tk
            # heavy q tiles first: they finish last otherwise
            order = torch.argsort(ends, descending=True)
            starts, ends, nfull = starts[order], ends[order], nfull[order]
            n = len(starts)
            mems = {"q": regions(q, n, starts, 0, ends - starts, H), "k": regions(k, n, 0, 0, ends, H),
                    "v": regions(v, n, 0, 0, ends, H), "o": regions(o, n, starts, 0, ends - starts, H)}
            batch = TaskBatch(fn, mems, {"qpos": starts, "nfull": nfull, "nkv": ends}, n)
            return _launch_config("flash_fused", warps, stages, group).prepare(batch)

        config = dict(tq=tq, tk=tk, warps=warps, stages=stages, group=group)
        out.append(measure("flash", config, flops, o, ref, build))
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seq", type=int, default=16384)
    ap.add_argument("--rows", type=int, default=128)
    ap.add_argument("--json", default=None)
    ap.add_argument("--only", default="matmul,flash")
    args = ap.parse_args()
    res = {"device": torch.cuda.get_device_name(0), "seq": args.seq}
    if "matmul" in args.only:
        res["matmul"] = {f"{K}x{N}": tune_matmul(args.seq, K, N, args.rows)
                         for K, N in ((4096, 4096), (4096, 11008), (11008, 4096))}
    if "swiglu" in args.only:
        res["swiglu"] = tune_swiglu(args.seq)
    if "flash" in args.only:
        res["flash"] = tune_flash(args.seq)
    best = {}
    for key, rows in res.get("matmul", {}).items():
        ok = [r for r in rows if "ms" in r and r["rel_err"] < 1e-2]
        if ok:
            best[f"matmul {key}"] = min(ok, key=lambda r: r["ms"])
    ok = [r for r in res.get("swiglu", []) if "ms" in r and r["rel_err"] < 1e-2]
    if ok:
        best["swiglu"] = min(ok, key=lambda r: r["ms"])
    ok = [r for r in res.get("flash", []) if "ms" in r and r["rel_err"] < 2e-2]
    if ok:
        best["flash"] = min(ok, key=lambda r: r["ms"])
    res["best"] = best
    print(json.dumps(best, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
