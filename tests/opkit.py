"""Test helpers: build a one-op InCore function and run it on the reference interpreter (or any
runner with the same signature), plus float64 references of every tile op."""

from __future__ import annotations

import numpy as np
import torch

from pto import InCore
from pto.data.batch import TaskBatch
from pto.interp.incore import run_incore
from pto.ir.dtypes import DType

# tolerance of a result rounded to the dtype, relative to the largest magnitude
TOL = {DType.F32: 2e-6, DType.F16: 2e-3, DType.BF16: 1.6e-2}

UNARY_REF = {
    "exp": np.exp, "exp2": np.exp2, "log": np.log, "sqrt": np.sqrt, "rsqrt": lambda x: 1 / np.sqrt(x),
    "recip": lambda x: 1 / x, "neg": np.negative, "abs": np.abs, "relu": lambda x: np.maximum(x, 0),
    "silu": lambda x: x / (1 + np.exp(-x)),
}
BINARY_REF = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide,
              "max": np.maximum, "min": np.minimum}


def rand(shape, dtype: DType, rng: np.random.Generator, positive=False, away_from_zero=False):
    x = rng.standard_normal(shape)
    if positive:
        x = np.abs(x) + 0.1
    if away_from_zero:
        x = np.sign(x) * (np.abs(x) + 0.5)
    t = torch.tensor(x, dtype=torch.float32).to(dtype.torch)
    return t


def one_op(op: str, dst_shape, tile_srcs, dtype: DType, scalars=(), dst_dtype=None, init_dst=None,
           runner=run_incore, **attrs):
    """Run ``op dst, *tile_srcs, *scalars`` where each tile source is a torch tensor loaded from
    its own memref; return the destination as a float64 numpy array."""
    dst_dtype = dst_dtype or dtype
    k = InCore(f"one_{op}")
    regions = {}
    tiles = []
    for i, t in enumerate(tile_srcs):
        dt = DType.F32 if t.dtype == torch.float32 else DType.F16 if t.dtype == torch.float16 else DType.BF16
        m = k.memref(f"in{i}", dt)
        tile = k.tile(f"a{i}", t.shape[0], t.shape[1], dt)
        k.load(tile, m, 0, 0)
        tiles.append(tile)
        regions[f"in{i}"] = (t.contiguous(), 0, 0, t.shape[0], t.shape[1])
    out = torch.full(dst_shape, float("nan"), dtype=dst_dtype.torch)
    d = k.tile("d", dst_shape[0], dst_shape[1], dst_dtype)
    if init_dst is not None:
        out.copy_(init_dst)
        mo = k.memref("out", dst_dtype)
        k.load(d, mo, 0, 0)
    else:
        mo = k.memref("out", dst_dtype)
    getattr(k, op)(d, *tiles, *scalars, **attrs)
    k.store(mo, 0, 0, d)
    fn = k.build()
    regions["out"] = (out, 0, 0, dst_shape[0], dst_shape[1])
    runner(fn, regions, {})
    return out.double().numpy()


def f64(t: torch.Tensor) -> np.ndarray:
    return t.double().numpy()


def assert_close(got: np.ndarray, want: np.ndarray, dtype: DType, what: str = ""):
    assert got.shape == want.shape, (got.shape, want.shape)
    assert np.isfinite(got).all(), f"{what}: non-finite output"
    scale = max(np.abs(want).max(), 1e-30)
    err = np.abs(got - want).max() / scale
    assert err <= TOL[dtype], f"{what}: max error {err:.3e} > {TOL[dtype]:.1e} ({dtype})"


# agreement of the Triton backend with the reference interpreter: relative, plus absolute
# relative to the largest value (sums in another order differ where terms cancel)
AGREE = {DType.F32: (1e-5, 2e-6), DType.F16: (1e-3, 1e-3)}


#: the Triton backend of each device that run_incore_triton launches on (one is enough)
_TRITON: dict[str, object] = {}


def run_incore_triton(fn, regions: dict[str, tuple], scalars: dict[str, int] | None = None) -> None:
    """Run one task through the Triton backend, in place, called as the reference interpreter's
    :func:`~pto.interp.incore.run_incore` (a specialized function: no dims left)."""
    from pto.backends.triton import TritonBackend

    assert not fn.dims, f"`{fn.name}` still has dims {dict(fn.dims)}; specialize it first"
    batch = TaskBatch.one(fn, regions, scalars)
    dev = str(next(iter(batch.mems.values())).tensor.device)
    if dev not in _TRITON:
        _TRITON[dev] = TritonBackend(dev)
    _TRITON[dev].prepare(batch)()


def triton_vs_interp(op: str, dst_shape, srcs, dtype: DType, **kw) -> np.ndarray:
    """``op`` through the Triton backend, checked against the reference interpreter; returns
    the Triton result as float64."""
    got = one_op(op, dst_shape, srcs, dtype, runner=run_incore_triton, **kw)
    want = one_op(op, dst_shape, srcs, dtype, **kw)
    rtol, atol = AGREE[dtype]
    scale = float(np.nanmax(np.abs(np.where(np.isinf(want), 0, want)), initial=1.0))
    np.testing.assert_allclose(got, want, equal_nan=True, err_msg=op, rtol=rtol, atol=atol * scale)
    return got
