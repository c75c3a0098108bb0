"""The Triton renderer's second load for a tile a loop both multiplies and reads otherwise
(pto/codegen/triton/operands.py): which loops it rewrites, that the rewrite computes what the
function means (the Triton interpreter against the evaluator), and the loops it leaves alone.
The GPU half (the wrong results it avoids under Triton 3.6's pipelining) is
tests/gpu/test_gpu.py::test_a_multiplied_tile_read_otherwise_is_right_at_every_pipeline_depth."""

from __future__ import annotations

import os

import pytest
import torch

from pto import InCore, f32
from pto.codegen.triton.operands import separate_operand_loads
from pto.interp.incore import run_incore
from pto.ir.analysis import specialize
from pto.ir.dtypes import DType
from pto.ir.nodes import ForRange, walk_instrs
from pto.ir.ops import Op


def squares_in_the_k_loop(dtype=DType.F32, R=16, K=64, N=32, bk=16, before=False, rewrite_a=False):
    """``y = diag(rsqrt(mean(x^2) + eps)) (x @ w)``, the squares summed from the K loop's own x
    tile (the pattern of the first folded projection of docs/PERF.md's eighth session).
    ``before``: the loop reads the tile before loading it; ``rewrite_a``: it writes the tile."""
    k = InCore("squares")
    x, w, y = k.memref("x", dtype), k.memref("w", dtype), k.memref("y", f32)
    a, b = k.tile("a", R, bk, dtype), k.tile("b", bk, N, dtype)
    acc, sq = k.tile("acc", R, N, f32), k.tile("sq", R, bk, f32)
    part, ss = k.tile("part", R, 1, f32), k.tile("ss", R, 1, f32)
    k.full(acc, 0.0)
    k.full(ss, 0.0)
    k.full(a, 0.0)
    with k.for_range("kk", 0, K, bk) as kk:
        if before:
            k.cast(sq, a)
        k.load(a, x, 0, kk)
        k.load(b, w, kk, 0)
        k.matmul_acc(acc, a, b)
        if rewrite_a:
            k.muls(a, a, 2.0)
        k.cast(sq, a)
        k.mul(sq, sq, sq)
        k.rowsum(part, sq)
        k.add(ss, ss, part)
    k.muls(ss, ss, 1.0 / K)
    k.adds(ss, ss, 1e-5)
    k.rsqrt(ss, ss)
    k.rowexpandmul(acc, acc, ss)
    k.store(y, 0, 0, acc)
    return specialize(k.build())


def _loop(fn):
    (loop,) = [s for s in fn.body if isinstance(s, ForRange)]
    return list(walk_instrs(loop.body))


def test_the_other_readers_get_a_load_of_their_own():
    fn = squares_in_the_k_loop()
    out, copies = separate_operand_loads(fn)
    assert copies == {"a__v"}
    ins = _loop(out)
    loads = [(i.dst, i.srcs) for i in ins if i.op is Op.LOAD]
    assert loads[:2] == [("a", loads[0][1]), ("a__v", loads[0][1])]  # the same region, right after
    (mm,) = [i for i in ins if i.op is Op.MATMUL_ACC]
    assert mm.srcs == ("a", "b")  # the product keeps its load
    (cast,) = [i for i in ins if i.op is Op.CAST]
    assert cast.srcs == ("a__v",)
    assert out.tile("a__v").dtype == fn.tile("a").dtype and out.tile("a__v").rows == fn.tile("a").rows


@pytest.mark.parametrize("kw", [{"before": True}, {"rewrite_a": True}], ids=["read-before-load", "written"])
def test_loops_it_leaves_alone(kw):
    fn = squares_in_the_k_loop(**kw)
    assert separate_operand_loads(fn) == (fn, frozenset())


def test_functions_without_the_pattern_are_the_same_object():
    from pto.incore.attention import flash_fused
    from pto.incore.matmul import matmul_tile

    for fn in (specialize(matmul_tile(DType.BF16, 128, 512, 512, 256, 64)),
               specialize(flash_fused(DType.BF16, 4, 64, 64, 64))):
        got, copies = separate_operand_loads(fn)
        assert got is fn and not copies


@pytest.mark.interpret
@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs the Triton interpreter")
def test_the_rewritten_kernel_computes_the_function():
    from tests.opkit import run_incore_triton

    fn = squares_in_the_k_loop()
    g = torch.Generator().manual_seed(4)
    x, w = torch.randn(16, 64, generator=g), torch.randn(64, 32, generator=g)
    outs = []
    for run in (run_incore, run_incore_triton):
        y = torch.full((16, 32), float("nan"))
        run(fn, {"x": (x, 0, 0, 16, 64), "w": (w, 0, 0, 64, 32), "y": (y, 0, 0, 16, 32)})
        outs.append(y)
    want = (x.double() * torch.rsqrt(x.double().pow(2).mean(-1, keepdim=True) + 1e-5)) @ w.double()
    torch.testing.assert_close(outs[1], outs[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(outs[0].double(), want, rtol=2e-5, atol=2e-5)
