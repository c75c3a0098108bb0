"""Batched tiled GEMM: C[b] = A[b] @ B[b] for b < batch, with A[b] of M x K and B[b] of K x N.

The batch is stacked along rows (A is batch*M x K, B is batch*K x N, C is batch*M x N). The
orchestration loops over batches and M x N output tiles; the K reduction runs inside the
InCore function. M, N and K need not be multiples of the tiles.
"""

from __future__ import annotations

import torch
from pto.incore.matmul import gemm_tile

from pto import Orchestration, Var, cdiv, emin
from pto.ir.expr import Const
from pto.program import Program, Settings, ShapeParam, seeded_randn

# batch, N, K, and the tile sizes per config; M is the sequence length given on the command line
CONFIGS = {
    "tiny": dict(batch=2, n=80, k=96, tm=32, tn=64, tk=32),
    "7b": dict(batch=4, n=4096, k=4096, tm=64, tn=128, tk=64),
}


def fit_tiles(dtype, tm: int, tn: int, tk: int, target) -> tuple[int, int, int]:
    """The configured tile sizes, halved (columns first) until the tile kernel fits the target."""
    from pto.errors import SramError

    while True:
        try:
            gemm_tile(dtype, tm, tn, tk, target)
            return tm, tn, tk
        except SramError:
            if tn > 16:
                tn //= 2
            elif tm > 16:
                tm //= 2
            elif tk > 16:
                tk //= 2
            else:
                raise


def build_module(dtype, tm: int, tn: int, tk: int, target=None):
    if target is not None:
        tm, tn, tk = fit_tiles(dtype, tm, tn, tk, target)
    f = gemm_tile(dtype, tm, tn, tk, target)
    o = Orchestration("bgemm")
    batch, M, N, K = o.scalar("batch"), o.scalar("M"), o.scalar("N"), o.scalar("K")
    A = o.input("A", batch * M, K, dtype)
    B = o.input("B", batch * K, N, dtype)
    C = o.output("C", batch * M, N, dtype)
    with o.for_loop("b", 0, batch) as b, o.for_loop("mi", 0, cdiv(M, tm)) as mi:
        with o.for_loop("ni", 0, cdiv(N, tn)) as ni:
            rows = emin(tm, M - mi * tm)
            cols = emin(tn, N - ni * tn)
            o.call(f, {
                "a": (A, b * M + mi * tm, 0, rows, K),
                "b": (B, b * K, ni * tn, K, cols),
                "c": (C, b * M + mi * tm, ni * tn, rows, cols),
                "K": K,
            })
    return o.module()


class BgemmProgram(Program):
    name = "bgemm"
    description = "batched GEMM C[b] = A[b] @ B[b], M = seq"
    configs = CONFIGS
    shape_params = (ShapeParam("seq", 100, "rows M of each product"),)
    outputs = ("C",)

    def build(self, s: Settings, shape=None):
        c = CONFIGS[s.config]
        return build_module(s.dtype, c["tm"], c["tn"], c["tk"], s.target)

    def scalar_exprs(self, s):
        c = CONFIGS[s.config]
        return {"batch": Const(c["batch"]), "M": Var("seq"), "N": Const(c["n"]), "K": Const(c["k"])}

    def inputs(self, s, shape, device, seed=0):
        c, seq = CONFIGS[s.config], shape["seq"]
        g = torch.Generator().manual_seed(seed)
        return {
            "A": seeded_randn((c["batch"] * seq, c["k"]), s.dtype, device, g),
            "B": seeded_randn((c["batch"] * c["k"], c["n"]), s.dtype, device, g),
        }

    def reference(self, s, shape, inputs):
        c, seq = CONFIGS[s.config], shape["seq"]
        a = inputs["A"].double().view(c["batch"], seq, c["k"])
        b = inputs["B"].double().view(c["batch"], c["k"], c["n"])
        out = torch.bmm(a, b).view(c["batch"] * seq, c["n"])
        return {"C": out.to(inputs["A"].dtype)}

    def flops(self, s, shape):
        c = CONFIGS[s.config]
        return 2.0 * c["batch"] * shape["seq"] * c["n"] * c["k"]


PROGRAM = BgemmProgram()
