"""What tensor descriptors (TMA), a persistent tile loop and warp specialization would buy the
layer's GEMMs on this GPU, before the renderer emits them (issue 23): one bf16 GEMM of the
LLaMA-7B layer's shapes timed as cuBLAS (``torch.mm``), as a Triton kernel of pointer loads
with the tiles the layer's ``matmul_tile`` uses (128 x 256 outputs, K steps of 64, 8 warps,
grouped program order), as the same kernel loading through host tensor descriptors, plain and
persistent with warp specialization, and as pto's own ``matmul_tile`` (the generated batched
kernel through the Triton backend: one task per 128-row tile, the schedules the layer ships).

    python3 bench/gemm_probe.py [--m 16384] [--shapes 4096x4096,4096x11008,11008x4096]

Prints TFLOP/s per variant and shape (the median of 20 launches, each timed by CUDA events:
:func:`pto.exec.timing.median_ms`).
"""

from __future__ import annotations

import argparse
import json

import torch
import triton
import triton.language as tl

from pto.exec.timing import median_ms


@triton.jit
def _tile_ids(pid, M, N, BM: tl.constexpr, BN: tl.constexpr, GROUP: tl.constexpr):
    pm_n, pn_n = tl.cdiv(M, BM), tl.cdiv(N, BN)
    per = GROUP * pn_n
    first = (pid // per) * GROUP
    size = tl.minimum(pm_n - first, GROUP)
    return first + (pid % per) % size, (pid % per) // size


@triton.jit
def gemm_ptr(a, b, c, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP: tl.constexpr):
    pm, pn = _tile_ids(tl.program_id(0), M, N, BM, BN, GROUP)
    rm = pm * BM + tl.arange(0, BM)
    rn = pn * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), tl.float32)
    for k in range(0, K, BK):
        x = tl.load(a + rm[:, None] * K + (k + rk)[None, :])
        w = tl.load(b + (k + rk)[:, None] * N + rn[None, :])
        acc = tl.dot(x, w, acc)
    tl.store(c + rm[:, None] * N + rn[None, :], acc.to(tl.bfloat16))


@triton.jit
def gemm_tma(a_d, b_d, c_d, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP: tl.constexpr):
    pm, pn = _tile_ids(tl.program_id(0), M, N, BM, BN, GROUP)
    acc = tl.zeros((BM, BN), tl.float32)
    for k in range(0, K, BK):
        acc = tl.dot(a_d.load([pm * BM, k]), b_d.load([k, pn * BN]), acc)
    c_d.store([pm * BM, pn * BN], acc.to(tl.bfloat16))


@triton.jit
def gemm_tma_ws(a_d, b_d, c_d, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                GROUP: tl.constexpr, SMS: tl.constexpr):
    tiles = tl.cdiv(M, BM) * tl.cdiv(N, BN)
    for t in tl.range(tl.program_id(0), tiles, SMS, flatten=True, warp_specialize=True):
        pm, pn = _tile_ids(t, M, N, BM, BN, GROUP)
        acc = tl.zeros((BM, BN), tl.float32)
        for k in range(0, K, BK):
            acc = tl.dot(a_d.load([pm * BM, k]), b_d.load([k, pn * BN]), acc)
        c_d.store([pm * BM, pn * BN], acc.to(tl.bfloat16))


def pto_gemm(a, b, c, launch: dict | None = None):
    """pto's generated ``matmul_tile`` over the rows of ``a`` in 128-row tasks, as the layer
    launches it (the backend's shipped-schedule lookup included; ``launch``: settings that
    override it)."""
    from pto.incore.matmul import matmul_tile

    from pto import bf16
    from pto.backends.base import get_backend
    from pto.data.batch import RegionBatch, TaskBatch
    from pto.ir.analysis import specialize
    from pto.programs import get

    M, K = a.shape
    N = b.shape[1]
    fn = specialize(matmul_tile(bf16, 128, K, N, 256, 64), {"R": 128, "K": K, "N": N})
    n = M // 128
    ar = torch.arange(n) * 128

    def rb(t, r0, rows, cols):
        return RegionBatch(t, r0, torch.zeros(n, dtype=torch.int64), torch.full((n,), rows), torch.full((n,), cols))

    batch = TaskBatch(fn, {"x": rb(a, ar, 128, K), "w": rb(b, torch.zeros(n, dtype=torch.int64), K, N),
                           "y": rb(c, ar, 128, N)}, {}, n)
    over = {"matmul_tile": launch} if launch else None
    return get_backend("triton", "cuda", over, shipped=get("llama7b").schedules).prepare(batch)


def shape_row(M: int, K: int, N: int, pto_launch: list[dict], sms: int) -> dict:
    """Every variant's time and error on one GEMM shape."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    BM, BN, BK, GROUP = 128, 256, 64, 8
    g = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(M, K, device="cuda", generator=g).bfloat16()
    b = (torch.randn(K, N, device="cuda", generator=g) / K ** 0.5).bfloat16()
    c = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
    ref = a.float() @ b.float()
    grid = (triton.cdiv(M, BM) * triton.cdiv(N, BN),)
    ad, bd = TensorDescriptor.from_tensor(a, [BM, BK]), TensorDescriptor.from_tensor(b, [BK, BN])
    cd = TensorDescriptor.from_tensor(c, [BM, BN])
    variants = {
        "cublas": lambda: torch.mm(a, b, out=c),
        "pto": pto_gemm(a, b, c),
        **{f"pto {json.dumps(o)}": pto_gemm(a, b, c, o) for o in pto_launch},
        "pointers": lambda: gemm_ptr[grid](a, b, c, M, N, K, BM, BN, BK, GROUP, num_warps=8, num_stages=3),
        "tma": lambda: gemm_tma[grid](ad, bd, cd, M, N, K, BM, BN, BK, GROUP, num_warps=8, num_stages=3),
        "tma_ws_persistent": lambda: gemm_tma_ws[(sms,)](ad, bd, cd, M, N, K, BM, BN, BK, GROUP, sms,
                                                         num_warps=8, num_stages=3),
    }
    row = {"M": M, "K": K, "N": N}
    for name, f in variants.items():
        try:
            ms = median_ms(f, repeat=20, warmup=2, cuda=True)
            err = float((c.float() - ref).norm() / ref.norm())
            row[name] = {"ms": round(ms, 4), "tflops": round(2 * M * N * K / ms / 1e9, 1), "rel_err": err}
        except Exception as e:  # a variant this Triton cannot compile: reported, not fatal
            row[name] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"}
        print(f"{K}x{N}", name, row[name], flush=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--m", type=int, default=16384)
    ap.add_argument("--shapes", default="4096x4096,4096x11008,11008x4096", help="KxN,...")
    ap.add_argument("--pto-launch", default="", help="launch settings of pto's kernel to time besides its "
                    "own, as JSON objects separated by ';' (e.g. '{\"GROUP\": 8}')")
    ap.add_argument("--json")
    args = ap.parse_args()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    launch = [json.loads(o) for o in args.pto_launch.split(";") if o]
    rows = [shape_row(args.m, *(int(v) for v in shape.split("x")), launch, sms) for shape in args.shapes.split(",")]
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1)


if __name__ == "__main__":
    main()
