"""InCore functions and helpers shared by the Triton backend's tests (test_triton_backend.py,
test_triton_programs.py): small kernels that exercise region edges, batches, the parallel axis,
scalar expressions and loop-carried tiles, run through a backend's launch, and the temporary
source cache every such test module uses (``temp_cache_dir``: import it, it applies itself)."""

from __future__ import annotations

import math
import os

import pytest

from pto import InCore, emax, emin, eq, f32, land, lor, ne
from pto.data.batch import RegionBatch, TaskBatch
from pto.ir.expr import select

#: the marks of a module that hands CPU tensors to the kernels: the Triton interpreter's mode.
#: Where Triton compiles for a GPU (CUDA present, TRITON_INTERPRET unset) run such a file on its
#: own with TRITON_INTERPRET=1; tests/gpu/test_gpu.py covers the compiled kernels. Rows padded
#: with -inf give (-inf) - (-inf) in softmax, as in the reference.
INTERPRETER_ONLY = [pytest.mark.interpret,
                    pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                       reason="needs the Triton interpreter (TRITON_INTERPRET=1)"),
                    pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")]


@pytest.fixture(autouse=True, scope="module")
def temp_cache_dir(tmp_path_factory):
    """Generated sources go to a temporary cache, not the user's."""
    old = os.environ.get("PTO_CACHE_DIR")
    os.environ["PTO_CACHE_DIR"] = str(tmp_path_factory.mktemp("pto-cache"))
    yield
    if old is None:
        os.environ.pop("PTO_CACHE_DIR", None)
    else:
        os.environ["PTO_CACHE_DIR"] = old


def edge_fn(pad):
    k = InCore("edge")
    x, y = k.memref("x", f32), k.memref("y", f32)
    s = k.scalar("s")
    t = k.tile("t", 4, 4, f32)
    k.load(t, x, s // 2, s % 3, pad=pad)
    k.store(y, 0, 0, t)
    return k.build()


def run_batch(fn, mems, scalars, size, backend):
    backend.prepare(TaskBatch(fn, mems, scalars, size))()


def clone_mems(mems):
    return {k: RegionBatch(v.tensor.clone(), v.row0, v.col0, v.rows, v.cols) for k, v in mems.items()}


def rowwise_fn():
    """Row-normalize a 16x32 region with a scalar shift: loads with -inf padding, reductions,
    broadcasts, a scalar operand and a residual-aware column mask."""
    k = InCore("rowwise")
    x, y = k.memref("x", f32), k.memref("y", f32)
    s = k.scalar("s")
    t, m = k.tile("t", 16, 32, f32), k.tile("m", 16, 1, f32)
    k.load(t, x, 0, 0, pad=-math.inf)
    k.rowmax(m, t)
    k.rowexpandsub(t, t, m)
    k.exp(t, t)
    k.adds(t, t, s)
    k.mask_cols(t, t, x.cols, fill=0.0)
    k.store(y, 0, 0, t)
    return k.build()


def pgemm_fn():
    """``c[:, j*16 : j*16+16] = a @ b[:, j*16 : ...]`` for j on the parallel axis (NB blocks per
    task), with the K loop's trip count per task, masking columns past the region's end."""
    k = InCore("pgemm")
    K, NB = k.scalar("K"), k.scalar("NB")
    a, b = k.memref("a", f32, shape=(16, K)), k.memref("b", f32, shape=(K, NB * 16))
    c = k.memref("c", f32)
    j = k.parallel("j", NB)
    ta, tb, acc = k.tile("ta", 16, 16, f32), k.tile("tb", 16, 16, f32), k.tile("acc", 16, 16, f32)
    k.full(acc, 0.0)
    with k.for_range("kk", 0, K, 16) as kk:
        k.load(ta, a, 0, kk)
        k.load(tb, b, kk, j * 16)
        k.matmul_acc(acc, ta, tb)
    k.mask_cols(acc, acc, c.cols - j * 16, fill=-2.0)
    k.store(c, 0, j * 16, acc)
    return k.build()


def scalar_exprs(s, o):
    return [s // 3, s % 4, (-s) // 4, s // -2, s % -3, (s * 5 - 1) // 7, emin(s, 2), emax(s, -2),
            select(s < 0, 10, 20), land(s > -5, s < 5), lor(s < -5, s > 5), eq(s, 0), ne(s, 0),
            s <= 1, s >= 1, o.rows * 2 - s]


def scalars_fn(with_exprs=False):
    k = InCore("scalars")
    s = k.scalar("s")
    o = k.memref("o", f32)
    z, t = k.tile("z", 1, 16, f32), k.tile("t", 1, 16, f32)
    k.full(z, 0.0)
    exprs = scalar_exprs(s, o)
    for i, e in enumerate(exprs):
        k.adds(t, z, e)
        k.store(o, i, 0, t)
    return (k.build(), exprs) if with_exprs else k.build()


def carry_fn():
    k = InCore("carry")
    n, m = k.scalar("n"), k.scalar("m")
    x, y = k.memref("x", f32, shape=(32, 16)), k.memref("y", f32)
    t, u, acc, tmp = (k.tile(nm, 4, 16, f32) for nm in ("t", "u", "acc", "tmp"))
    k.full(acc, 0.0)
    with k.for_range("i", 0, n) as i:
        k.load(t, x, i * 4, 0)
        k.mul(tmp, t, t)
        k.add(acc, acc, tmp)
    with k.for_range("i2", 0, m) as i2:
        k.load(tmp, x, i2 * 4 + 4, 0)
        k.muls(u, tmp, 2.0)
    k.add(acc, acc, t)
    k.add(acc, acc, u)
    k.store(y, 0, 0, acc)
    return k.build()


def subnormal_fn():
    """Constants Triton would type as fp64 if written as plain Python floats."""
    k = InCore("subnormal")
    x = k.memref("x", f32)
    t = k.tile("t", 4, 16, f32)
    k.full(t, 1e-40)
    k.adds(t, t, 1e-42)
    k.mask_rows(t, t, 2, fill=3e-41)
    k.store(x, 0, 0, t)
    return k.build()


# Runs in a fresh interpreter without TRITON_INTERPRET: Triton picks the interpreter or the
# compiler when its modules are imported, so one process cannot do both reliably.
def jobs_sm90(pairs):
    """:func:`tests.sm90.compile_sm90`'s jobs for ``(kernel, flags)`` pairs: upper-case launch keys
    (GROUP) are constexpr arguments, the rest compiler options; every pointer 16-aligned."""
    return [{"source": kern.source, "name": kern.name, "signature": kern.signature(), "aligned": True,
             "constexprs": {**flags, **{k: v for k, v in kern.launch.items() if k.isupper()}},
             "options": {k: v for k, v in kern.launch.items() if not k.isupper()}} for kern, flags in pairs]


def path_flags(fn, even: bool) -> dict[str, bool]:
    """The EVEN/ALIGN constexprs of ``fn``'s kernel, all ``even``: the mask-free or the masked path."""
    return {f"{w}_{p.name}": even for w in ("EVEN", "ALIGN") for p in fn.memrefs}


def compile_both_paths_sm90(functions, tmp_path) -> list[dict]:
    """Each function's kernel compiled for an H100 on the masked and the mask-free path (no GPU
    needed); fails naming every kernel that did not compile; the results otherwise."""
    from pto.codegen.triton import render
    from tests.sm90 import compile_sm90

    jobs = [(render(fn), path_flags(fn, even)) for fn in functions for even in (False, True)]
    results = compile_sm90(jobs_sm90(jobs), tmp_path)
    failed = [f"{r['name']}: {r['error'][:300]}" for r in results if not r["ok"]]
    assert not failed, "\n".join(failed)
    return results


def step_kernels(config: str, spec: str, batch: int = 1, qscales: str = "") -> dict:
    """The decode step's kernels of ``config`` with weights ``spec`` (``LAYERS/HEAD``:
    :meth:`~pto.orchestration.model.quantized.WeightTypes.of_spec`) at ``batch`` sequences as a
    GPU renders them (integer dots where "auto" takes them; the tiles' scales by ``qscales``,
    ``RenderOptions.qscales``), by field name."""
    from dataclasses import fields

    from pto.orchestration.model.decode import functions
    from pto.orchestration.model.program import CONFIGS, tiling_for
    from pto.orchestration.model.quantized import WeightTypes, for_weights

    from pto.codegen.triton import RenderOptions, render
    from pto.ir.analysis import specialize
    from pto.ir.dtypes import DType
    from pto.machine.target import get

    cfg, wt = CONFIGS[config], WeightTypes.of_spec(spec)
    fns = functions(cfg, DType.BF16, get("cuda_h100"), for_weights(tiling_for(cfg), wt, batch), batch, wtypes=wt)
    out, opts = {}, RenderOptions(qgemv="auto", asm=True, qscales=qscales)
    for f in fields(fns):
        fn = getattr(fns, f.name)
        if fn is not None and hasattr(fn, "body"):
            out[f.name] = render(specialize(fn) if fn.dims else fn, opts)
    return out


def tiny_decode_runner(seed: int):
    """The tiny model's decode step (batch 1, a 128-slot cache; the tiles ``TINY_TILING`` has
    when called) run by the wave executor on the CPU: ``run(backend, setup=None)`` returns the
    step's tensors after one run from a fresh copy of the seeded inputs (``setup(executor,
    backend)`` before it)."""
    from pto.data.buffers import allocate, tensor_shapes
    from pto.engine import resolve
    from pto.exec.waves import WaveExecutor
    from pto.runtime.graph import CompiledProgram

    job = resolve("model", device="cpu", dtype="f32", target="cuda_h100", config="tiny")
    prog, s = job.program, job.settings
    shape = prog.shape(cache=128, batch=1)
    module, scalars = prog.build(s, shape), prog.scalars(s, shape)
    inputs = prog.inputs(s, shape, "cpu", seed=seed)
    cp = CompiledProgram.get(module, target=s.target)

    def run(backend, setup=None) -> dict:
        fn = module.entry_function
        tensors = allocate(fn, tensor_shapes(fn, scalars), {k: v.clone() for k, v in inputs.items()}, "cpu")
        g = cp.build_graph(scalars)
        ex = WaveExecutor(backend, tensors)
        if setup is not None:
            setup(ex, backend)
        ex.run(g)
        g.close()
        return tensors

    run.module = module
    return run
