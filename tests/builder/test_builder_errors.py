"""Builder misuse: each case raises the project's exception with a message that names what the
user wrote (function, op, operand, parameter, tensor...)."""

from __future__ import annotations

import re

import pytest
import torch

from pto import BuildError, InCore, Orchestration, PTOError, bf16, f32
from pto.errors import RegionError


def _copy_fn(name="copy_tile", rows=32, cols=64, dtype=f32):
    k = InCore(name)
    R = k.dim("R", rows)
    x = k.memref("x", dtype)
    y = k.memref("y", dtype)
    t = k.tile("t", R, cols, dtype)
    k.load(t, x, 0, 0)
    k.store(y, 0, 0, t)
    return k.build()


def _raises(match: str):
    return pytest.raises(BuildError, match=match)


# --------------------------------------------------------------------------- InCore misuses

def test_shape_mismatch_names_tiles():
    k = InCore("addf")
    a, b, d = k.tile("a", 32, 128, f32), k.tile("b", 32, 64, f32), k.tile("d", 32, 128, f32)
    with _raises(r"`addf`, add %d, %a, %b .*: tile `d` is 32x128 but `b` is 32x64"):
        k.add(d, a, b)
    del a, b, d


def test_undeclared_tile():
    k = InCore("f")
    d = k.tile("d", 8, 8, f32)
    with _raises(r"`f`, exp %d, %ghost .*`ghost` is not a declared tile"):
        k.exp(d, "ghost")


def test_store_outside_declared_region():
    k = InCore("st")
    y = k.memref("y", f32, shape=(32, 64))
    t = k.tile("t", 32, 32, f32)
    k.full(t, 1.0)
    k.store(y, 0, 64, t)
    with _raises(r"`st`, store .*col offset `64` reaches 64, "
                 r"outside `y`'s declared region of cols \[0, 64\)"):
        k.build()


def test_negative_load_offset():
    k = InCore("neg")
    x, y = k.memref("x", f32), k.memref("y", f32)
    t = k.tile("t", 4, 4, f32)
    k.load(t, x, -4, 0)
    k.store(y, 0, 0, t)
    with _raises(r"`neg`, load .*row offset `-4` reaches -4, before the start of `x`'s region"):
        k.build()


def test_matmul_inner_dimension():
    k = InCore("mm")
    a, b, d = k.tile("a", 16, 32, f32), k.tile("b", 16, 8, f32), k.tile("d", 16, 8, f32)
    with _raises(r"`mm`, matmul %d, %a, %b .*inner dimensions differ: `a` is 16x32 and `b` is 16x8"):
        k.matmul(d, a, b)


def test_matmul_operand_dtypes():
    k = InCore("mm2")
    a, b, d = k.tile("a", 16, 16, bf16), k.tile("b", 16, 16, f32), k.tile("d", 16, 16, f32)
    with _raises(r"operands must share a dtype: `a` is bf16, `b` is f32"):
        k.matmul(d, a, b)


def test_row_reduction_destination():
    k = InCore("rs")
    a, d = k.tile("a", 16, 32, f32), k.tile("d", 1, 32, f32)
    with _raises(r"`rs`, rowsum %d, %a .*needs a 16x1 destination; `d` is 1x32"):
        k.rowsum(d, a)


def test_load_dtype_mismatch():
    k = InCore("ld")
    x = k.memref("x", bf16)
    t = k.tile("t", 8, 8, f32)
    with _raises(r"load between bf16 memref `x` and f32 tile `t`"):
        k.load(t, x, 0, 0)


def test_unused_tile():
    k = InCore("unused")
    x, y = k.memref("x", f32), k.memref("y", f32)
    t = k.tile("t", 8, 8, f32)
    k.tile("spare", 8, 8, f32)
    k.load(t, x, 0, 0)
    k.store(y, 0, 0, t)
    with _raises(r"`unused`: tile `spare` is declared but never used"):
        k.build()


def test_memref_never_accessed():
    k = InCore("lonely")
    x, y = k.memref("x", f32), k.memref("y", f32)
    k.memref("z", f32)
    t = k.tile("t", 8, 8, f32)
    k.load(t, x, 0, 0)
    k.store(y, 0, 0, t)
    with _raises(r"`lonely`: .*`z` is declared but never used"):
        k.build()


def test_duplicate_name():
    k = InCore("dup")
    k.tile("t", 8, 8, f32)
    with _raises(r"`dup`: `t` is already declared as tile"):
        k.memref("t", f32)


def test_tile_shape_uses_scalar():
    k = InCore("dyn")
    n = k.scalar("n")
    with _raises(r"tile `t` shape uses `n`, which is not a dim"):
        k.tile("t", n, 8, f32)


def test_undeclared_scalar_in_offset():
    k = InCore("off")
    x = k.memref("x", f32)
    t = k.tile("t", 8, 8, f32)
    with _raises(r"`off`, load .*scalar `kk` is not declared"):
        k.load(t, x, "kk", 0)


def test_unknown_attribute():
    k = InCore("attr")
    x = k.memref("x", f32)
    t = k.tile("t", 8, 8, f32)
    with pytest.raises(TypeError):
        k.load(t, x, 0, 0, padding=1.0)
    from pto.errors import ParseError
    from pto.ir.nodes import Instr
    from pto.ir.ops import Op
    from pto.text import parse_module

    del Instr, Op
    src = ('incore @f { param %x : memref f32\n tile %t : [8, 8] f32\n load %t, %x[0, 0] {bogus = 1}\n}\n'
           'entry @f\n')
    with pytest.raises(ParseError, match=r"`load` has no attribute `bogus`"):
        parse_module(src)


def test_bad_identifier():
    with _raises(r"InCore function name '2fast' is not an identifier"):
        InCore("2fast")


def test_non_positive_step():
    k = InCore("loop")
    with _raises(r"loop `kk` step must be a positive integer, got 0"), k.for_range("kk", 0, 8, 0):
        pass


# ---------------------------------------------------------------------- orchestration misuses

def _orch():
    o = Orchestration("prog")
    n = o.scalar("n")
    x = o.input("x", n, 64, f32)
    y = o.output("y", n, 64, f32)
    return o, n, x, y


def test_missing_binding():
    o, n, x, y = _orch()
    with _raises(r"call to `copy_tile`: missing binding for parameter `y`"):
        o.call(_copy_fn(), {"x": (x, 0, 0)})


def test_extra_binding():
    o, n, x, y = _orch()
    with _raises(r"`copy_tile` has no parameter `z` \(its parameters: x, y, R\)"):
        o.call(_copy_fn(), {"x": x, "y": y, "z": x})


def test_scalar_bound_to_tensor():
    k = InCore("sc")
    m = k.scalar("m")
    x, y = k.memref("x", f32), k.memref("y", f32)
    t = k.tile("t", 8, 8, f32)
    k.load(t, x, m, 0)
    k.store(y, 0, 0, t)
    f = k.build()
    o, n, x, y = _orch()
    with _raises(r"call to `sc`: scalar parameter `m` is bound to a tensor"):
        o.call(f, {"x": x, "y": y, "m": x})


def test_memref_bound_to_scalar():
    o, n, x, y = _orch()
    with _raises(r"call to `copy_tile`: memref parameter `x` must be bound to a tensor or "
                 r"\(tensor, row, col\[, rows, cols\]\), got Var"):
        o.call(_copy_fn(), {"x": n, "y": y})


def test_unknown_function():
    o, n, x, y = _orch()
    with _raises(r"call to unknown function `rmsnorm_tile`"):
        o.call("rmsnorm_tile", {"x": x})


def test_undeclared_tensor():
    o, n, x, y = _orch()
    with _raises(r"tensor `temp_norm` for parameter `x` is not declared"):
        o.call(_copy_fn(), {"x": ("temp_norm", 0, 0), "y": y})


def test_undeclared_scalar_in_binding():
    o, n, x, y = _orch()
    with _raises(r"call to `copy_tile`, `x` row offset: scalar `tile_i` is not declared"):
        o.call(_copy_fn(), {"x": (x, "tile_i * 32", 0), "y": y})


def test_tensor_dtype_mismatch():
    o, n, x, y = _orch()
    with _raises(r"parameter `x` is bf16 but tensor `x` is f32"):
        o.call(_copy_fn(dtype=bf16), {"x": x, "y": y})


def test_write_to_input_tensor():
    o, n, x, y = _orch()
    with _raises(r"`copy_tile` writes parameter `y` but tensor `x` is an input"):
        o.call(_copy_fn(), {"x": y, "y": x})


def test_region_wider_than_callee():
    o, n, x, y = _orch()
    with _raises(r"`x` cols 128 exceed the 64 that `copy_tile` accesses in `x`"):
        o.call(_copy_fn(), {"x": (x, 0, 0, 32, 128), "y": y})


@pytest.mark.parametrize("kw,msg", [
    (dict(tile_levels={8: 64}), r"tile_levels needs key 0"),
    (dict(tile_levels={0: 32, 8: 64}, max_range=6), r"max_range must be a positive power of two, got 6"),
    (dict(tile_levels={0: 32, 8: 48}),
     r"tile height 48 for blocks of 8 is not a positive multiple of the base height 32"),
    (dict(tile_levels={0: 32, 16: 64}, max_range=8),
     r"tile_levels key 16 lies outside \[min_range, max_range\] = \[8, 8\]"),
    (dict(max_range=8), r"max_range/min_range need tile_levels"),
    (dict(tile_levels={0: 32, 1: 64}), r"a block of 1 base tiles cannot be cut into tiles of 64 rows"),
    (dict(tile_levels={0: 32, 4: 64}, min_range=8, max_range=4), r"min_range 8 exceeds max_range 4"),
])
def test_bad_loop_attributes(kw, msg):
    o, n, x, y = _orch()
    with _raises(r"`prog`.*loop `i`: " + msg), o.for_loop("i", 0, n, **kw):
        pass


def test_adaptive_loop_needs_tile_height():
    o, n, x, y = _orch()
    with _raises(r"call to `copy_tile` inside adaptive loop `i` moves with `i` but never uses its tile "
                 r"height `i.rows`"), o.for_loop("i", 0, n, tile_levels={0: 32, 2: 64}) as i:
        o.call(_copy_fn(), {"x": (x, i * 32, 0), "y": (y, i * 32, 0)})


def test_rows_outside_adaptive_loop():
    o, n, x, y = _orch()
    with _raises(r"`i.rows` is only defined inside the adaptive loop `i`"), o.for_loop("i", 0, n) as i:
        o.call(_copy_fn(), {"x": (x, i * 32, 0), "y": (y, i * 32, 0)}, dims={"R": i.rows})


def test_else_without_if():
    o, n, x, y = _orch()
    with _raises(r"else_\(\) must directly follow an if_\(\) block"), o.else_():
        pass


def test_unused_tensor():
    o, n, x, y = _orch()
    o.temp("scratch", n, 64, f32)
    o.call(_copy_fn(), {"x": (x, 0, 0), "y": (y, 0, 0)})
    with _raises(r"tensor `scratch` is declared but no call uses it"):
        o.build()


def test_region_outside_tensor_at_run_time():
    from pto.interp.orchestration import run_program

    o, n, x, y = _orch()
    with o.for_loop("i", 0, 2) as i:
        o.call(_copy_fn(), {"x": (x, i * 32, 0), "y": (y, i * 32, 0)})
    m = o.module()
    with pytest.raises(RegionError, match=re.escape("region of `x` rows [32, 64) x cols [0, 64) lies "
                                                    "outside tensor `x` (40x64)")):
        run_program(m, {"x": torch.randn(40, 64)}, {"n": 40})


def test_one_exception_family():
    assert issubclass(BuildError, PTOError) and issubclass(RegionError, PTOError)
