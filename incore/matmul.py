"""Matmul tiles, the K reduction inside the function and f32 accumulation in every one.

- :func:`gemm_tile`: one TM x TN block of ``C = A @ B`` (the batched GEMM's tile);
- :func:`matmul_tile`: an R x K row tile of activations against a whole K x N weight, output
  column blocks on the parallel axis (a transformer's projections);
- :func:`matmul_residual_tile` and :func:`matmul_swiglu_tile`: the same with the residual add or
  SwiGLU in the epilogue, so the result never makes a round trip through memory;
- :func:`matmul_nk_tile`, :func:`matmul_nk_residual_tile` and :func:`matmul_nk_swiglu_tile`: the
  row tile against a weight stored output-major (``[N, K]``, as GGUF and ``nn.Linear`` keep it),
  of any dtype the weight is stored in: a quantized one (:mod:`pto.ir.quant`) is read as stored, each weight tile's load
  dequantizing its blocks into the activations' dtype (a prefill's projections on quantized
  weights, with no dense copy of them).
"""

from __future__ import annotations

from pto import InCore, cdiv, f32
from pto.ir.nodes import IncoreFunction


def gemm_tile(dtype=f32, tm: int = 32, tn: int = 64, tk: int = 32, target=None) -> IncoreFunction:
    """``c = a @ b`` for a TM x K block of A and a K x TN block of B; K is a scalar parameter,
    the loop over K runs inside the function and accumulates in f32. A K that is not a multiple
    of TK is handled by the masked (zero-padded) overhang of the last K tile."""
    k = InCore("gemm_tile")
    TM, TN, TK = k.dim("TM", tm), k.dim("TN", tn), k.dim("TK", tk)
    K = k.scalar("K")
    a = k.memref("a", dtype, shape=(TM, K))
    b = k.memref("b", dtype, shape=(K, TN))
    c = k.memref("c", dtype)
    ta = k.tile("ta", TM, TK, dtype)
    tb = k.tile("tb", TK, TN, dtype)
    acc = k.tile("acc", TM, TN, f32)
    k.full(acc, 0.0)
    with k.for_range("kk", 0, K, TK) as kk:
        k.load(ta, a, 0, kk)
        k.load(tb, b, kk, 0)
        k.matmul_acc(acc, ta, tb)
    if dtype != f32:
        out = k.tile("out", TM, TN, dtype)
        k.cast(out, acc)
        k.store(c, 0, 0, out)
    else:
        k.store(c, 0, 0, acc)
    return k.build(target)


def _row_tile_matmul(dtype, rows: int, K: int, N: int, bn: int, bk: int, residual: bool,
                     target=None, nk_dtype=None, name: str | None = None) -> IncoreFunction:
    """An R x K row tile against a whole K x N weight: the K reduction inside (f32 accumulation),
    a parallel axis over output column blocks of ``bn``; with ``residual``, ``+ r`` in the
    epilogue (the sum never makes a round trip through memory). With ``nk_dtype`` the weight is
    stored output-major, ``[N, K]`` of that dtype, and the product is ``x @ w.T`` (``tb``): a
    weight tile is ``bn`` rows of ``bk`` contiguous inputs, so a quantized weight's tile is whole
    blocks of each row (``bk`` a multiple of the block: the verifier says so), which its load
    dequantizes into ``dtype`` (what a tensor-core dot takes; the dense copy a prefill would
    otherwise make rounds to ``dtype`` too). ``name``: the function's, where a module holds
    several (one per weight dtype)."""
    base = "matmul_nk" if nk_dtype is not None else "matmul"
    k = InCore(name or (f"{base}_residual_tile" if residual else f"{base}_tile"))
    R = k.dim("R", rows)
    KD, ND = k.dim("K", K), k.dim("N", N)
    x = k.memref("x", dtype, shape=(R, KD))
    w = k.memref("w", nk_dtype, shape=(ND, KD)) if nk_dtype is not None else k.memref("w", dtype, shape=(KD, ND))
    r = k.memref("r", dtype, shape=(R, ND)) if residual else None
    y = k.memref("y", dtype, shape=(R, ND))
    j = k.parallel("j", cdiv(ND, bn))
    a = k.tile("a", R, bk, dtype)
    bt = k.tile("bt", bn, bk, dtype) if nk_dtype is not None else k.tile("bt", bk, bn, dtype)
    acc = k.tile("acc", R, bn, f32)
    out = k.tile("out", R, bn, dtype) if dtype != f32 or residual else acc
    k.full(acc, 0.0)
    with k.for_range("kk", 0, KD, bk) as kk:
        k.load(a, x, 0, kk)
        if nk_dtype is not None:
            k.load(bt, w, j * bn, kk)
            k.matmul_acc(acc, a, bt, tb=True)
        else:
            k.load(bt, w, kk, j * bn)
            k.matmul_acc(acc, a, bt)
    if residual:
        k.load(out, r, 0, j * bn)
        k.add(acc, acc, out)  # mixed f32 + storage dtype: no second f32 block in registers
    if out is not acc:
        k.cast(out, acc)
    k.store(y, 0, j * bn, out)
    return k.build(target)


def matmul_tile(dtype, rows: int, K: int, N: int, bn: int, bk: int, target=None) -> IncoreFunction:
    """``y = x @ w`` for an R x K row tile against a whole K x N weight."""
    return _row_tile_matmul(dtype, rows, K, N, bn, bk, False, target)


def matmul_residual_tile(dtype, rows: int, K: int, N: int, bn: int, bk: int, target=None) -> IncoreFunction:
    """``y = r + x @ w``: :func:`matmul_tile` with the residual connection in the epilogue."""
    return _row_tile_matmul(dtype, rows, K, N, bn, bk, True, target)


def matmul_nk_tile(dtype, rows: int, K: int, N: int, bn: int, bk: int, wdtype=None, target=None,
                   name: str | None = None) -> IncoreFunction:
    """``y = x @ w.T`` for an R x K row tile against a whole output-major ``[N, K]`` weight of
    ``wdtype`` (by default ``dtype``; a quantized one is dequantized by the tiles' loads, so
    ``bk`` is whole blocks)."""
    return _row_tile_matmul(dtype, rows, K, N, bn, bk, False, target, wdtype or dtype, name)


def matmul_nk_residual_tile(dtype, rows: int, K: int, N: int, bn: int, bk: int, wdtype=None,
                            target=None, name: str | None = None) -> IncoreFunction:
    """``y = r + x @ w.T``: :func:`matmul_nk_tile` with the residual connection in the epilogue."""
    return _row_tile_matmul(dtype, rows, K, N, bn, bk, True, target, wdtype or dtype, name)


def swiglu_epilogue(k: InCore, g, u, y, col, R, bn: int, dtype) -> None:
    """``y[:, col:] = silu(g) * u`` from the gate and up accumulators (f32), each rounded to the
    storage dtype first, as the unfused layer stores the two projections."""
    k.store(y, 0, col, swiglu_rounded(k, g, u, R, bn, dtype))


def swiglu_rounded(k: InCore, g, u, R, bn: int, dtype):
    """``silu(g) * u`` from the gate and up accumulators (f32), each rounded to ``dtype`` first
    and the product too, as the unfused layer stores them: a ``dtype`` tile (``g`` and ``u``
    are overwritten)."""
    gb = k.tile("gb", R, bn, dtype)
    if dtype != f32:
        ub = k.tile("ub", R, bn, dtype)
        k.cast(gb, g)
        k.cast(ub, u)
        k.cast(g, gb)
        k.cast(u, ub)
    k.silu(g, g)
    k.mul(g, g, u)
    k.cast(gb, g)
    return gb


def _row_tile_swiglu(dtype, rows: int, K: int, N: int, bn: int, bk: int, target=None,
                     nk_dtype=None, name: str | None = None) -> IncoreFunction:
    """``y = silu(x @ wg) * (x @ wu)`` of one column block per program (the gate and up weights
    ``[K, N]``, or output-major ``[N, K]`` of ``nk_dtype`` with it: :func:`_row_tile_matmul`)."""
    k = InCore(name or ("matmul_nk_swiglu_tile" if nk_dtype is not None else "matmul_swiglu_tile"))
    R = k.dim("R", rows)
    KD, ND = k.dim("K", K), k.dim("N", N)
    x = k.memref("x", dtype, shape=(R, KD))
    wshape = (ND, KD) if nk_dtype is not None else (KD, ND)
    wg = k.memref("wg", nk_dtype or dtype, shape=wshape)
    wu = k.memref("wu", nk_dtype or dtype, shape=wshape)
    y = k.memref("y", dtype, shape=(R, ND))
    j = k.parallel("j", cdiv(ND, bn))
    a = k.tile("a", R, bk, dtype)
    tshape = (bn, bk) if nk_dtype is not None else (bk, bn)
    bg, bu = k.tile("bg", *tshape, dtype), k.tile("bu", *tshape, dtype)
    g, u = k.tile("g", R, bn, f32), k.tile("u", R, bn, f32)
    k.full(g, 0.0)
    k.full(u, 0.0)
    with k.for_range("kk", 0, KD, bk) as kk:
        k.load(a, x, 0, kk)
        at = (j * bn, kk) if nk_dtype is not None else (kk, j * bn)
        k.load(bg, wg, *at)
        k.load(bu, wu, *at)
        k.matmul_acc(g, a, bg, tb=nk_dtype is not None)
        k.matmul_acc(u, a, bu, tb=nk_dtype is not None)
    swiglu_epilogue(k, g, u, y, j * bn, R, bn, dtype)
    return k.build(target)


def matmul_swiglu_tile(dtype, rows: int, K: int, N: int, bn: int, bk: int, target=None) -> IncoreFunction:
    """``y = silu(x @ wg) * (x @ wu)``: the gate and up projections of one column block in one
    program (two accumulators share each loaded x tile) and SwiGLU in the epilogue."""
    return _row_tile_swiglu(dtype, rows, K, N, bn, bk, target)


def matmul_nk_swiglu_tile(dtype, rows: int, K: int, N: int, bn: int, bk: int, wdtype=None,
                          target=None, name: str | None = None) -> IncoreFunction:
    """``y = silu(x @ wg.T) * (x @ wu.T)``: :func:`matmul_swiglu_tile` against output-major ``[N,
    K]`` gate and up weights of ``wdtype`` (:func:`matmul_nk_tile`)."""
    return _row_tile_swiglu(dtype, rows, K, N, bn, bk, target, wdtype or dtype, name)
