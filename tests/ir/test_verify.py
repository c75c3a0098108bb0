"""The verifiers on modules the builder would never produce: parsed text (parse_module verifies
what it parses) and hand-made IR. Each malformed module is refused with one line naming the
function, the call site where there is one, and what is wrong; the builder applies the same
rules, so a program refused while building is refused as text with the same words."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from pto import (
    BuildError,
    InCore,
    Orchestration,
    ParseError,
    emin,
    f32,
    format_module,
    parse_expr,
    parse_module,
    verify_module,
)
from pto.ir.dtypes import DType
from pto.ir.expr import as_expr
from pto.ir.names import base_name, variant_name
from pto.ir.nodes import Instr, Module, RegionBinding
from pto.ir.ops import Op
from pto.ir.verify_orch import verify_orch
from pto.passes.expansion.binary_expansion import expand_binary, strip_adaptive
from pto.programs import get, names

BASE = """\
incore @copy_tile dims(%R = 32) {
  param %x : memref f32
  param %y : memref f32
  tile %t : [%R, 64] f32
  load %t, %x[0, 0]
  store %y[0, 0], %t
}

orchestration @prog {
  scalar %n
  tensor %x : [%n, 64] f32 input
  tensor %y : [%n, 64] f32 output
  let %m = (%n + 31) // 32
  for %i = 0 to %m step 1 {max_range = 2, min_range = 2, tile_levels = {0: 32, 2: 64}} {
    let %r = min(%i.rows, %n - %i * 32)
    call @copy_tile(x = %x[%i * 32, 0, %r, 64], y = %y[%i * 32, 0, %r, 64]) dims(R = %i.rows) loc "prog.py:12"
  }
}

entry @prog
"""

CALL = r"`prog` \(prog\.py:12\): call to `copy_tile`: "
LOOP = r"`prog`: loop `i`: "

# (what the text says instead, the one line the verifier answers)
CASES = [
    # calls
    ("call @copy_tile(", "call @copy(",
     r"`prog` \(prog\.py:12\): call to unknown function `copy` \(known: copy_tile\)"),
    ("call @copy_tile(", "call @prog(", r"call to `prog`: `prog` is an orchestration function; only InCore functions"),
    ("f32 output", "f32 input",
     CALL + r"`copy_tile` writes parameter `y` but tensor `y` is an input \(declare it inout or temp\)"),
    (", y = %y[%i * 32, 0, %r, 64]", "", CALL + r"missing binding for parameter `y`$"),
    ("y = %y[", "z = %y[", CALL + r"`copy_tile` has no parameter `z` \(its parameters: x, y, R\)"),
    ("%r, 64])", "%r, 64], x = %x[0, 0])", CALL + r"parameter `x` is bound twice"),
    ("x = %x[%i * 32, 0, %r, 64]", "x = %n", CALL + r"memref parameter `x` is bound to the scalar `%n`, not a region"),
    ("y = %y[", "y = %z[", CALL + r"tensor `z` for parameter `y` is not declared"),
    ("y = %y[", "y = %n[", CALL + r"memref parameter `y` is bound to scalar `n`"),
    ("[%n, 64] f32 input", "[%n, 64] bf16 input", CALL + r"parameter `x` is f32 but tensor `x` is bf16"),
    ("%r, 64])", "%r, 128])", CALL + r"`y` cols 128 exceed the 64 that `copy_tile` accesses in `y`"),
    ("%r, 64])", "%r, 0])", CALL + r"`y` cols must be positive, got 0"),
    ("dims(R = %i.rows)", "dims(Q = %i.rows)", CALL + r"`copy_tile` has no dim `Q` \(its dims: R\)"),
    ("dims(R = %i.rows)", "dims(R = 0)", CALL + r"dim `R` must be a positive integer, got 0"),
    ("dims(R = %i.rows)", "dims(R = 32)",
     r"`prog` \(prog\.py:12\): call to `copy_tile` inside adaptive loop `i` moves with `i` but never uses its "
     r"tile height `i\.rows`"),
    # expressions and scopes
    ("%n - %i * 32", "%N - %i * 32", r"`prog`: let `r`: scalar `N` is not declared"),
    ("%n - %i * 32", "%x.cols - %i * 32", r"let `r`: `x\.cols` means nothing in an orchestration function"),
    ("{max_range = 2, min_range = 2, tile_levels = {0: 32, 2: 64}} ", "",
     r"let `r`: `i\.rows` is only defined inside the adaptive loop `i`"),
    ("let %m = (%n + 31) // 32", "let %m = %n * 0.5", r"let `m`: `%n \* 0\.5` is not an integer expression"),
    ("to %m step", "to %x step", r"loop `i` upper bound: `x` is a tensor, not a scalar"),
    # declarations and names
    ("tensor %y : [%n, 64]", "tensor %y : [%m, 64]", r"`prog`: tensor `y` shape uses `m`, which is not a scalar"),
    ("let %m =", "let %n =", r"`prog`: `n` is already declared"),
    ("f32 output", "f32 scratch", r"tensor `y`: role must be one of input, output, inout, temp, got 'scratch'"),
    ("  let %m", "  tensor %z : [%n, 64] f32 temp\n  let %m", r"`prog`: tensor `z` is declared but no call uses it"),
    ("    call @copy_tile(x = %x[%i * 32, 0, %r, 64], y = %y[%i * 32, 0, %r, 64]) dims(R = %i.rows) "
     'loc "prog.py:12"', "", r"^`prog`: the orchestration function makes no calls$"),
    # loop attributes
    ("2: 64}", "2: 48}", LOOP + r"tile height 48 for blocks of 2 is not a positive multiple of the base height 32"),
    ("{0: 32, 2: 64}", "{0: 32, 3: 96}", LOOP + r"tile_levels key 3 is not a power of two"),
    ("max_range = 2,", "max_range = 3,", LOOP + r"max_range must be a positive power of two, got 3"),
    ("step 1 {max", "step 2 {max", LOOP + r"an adaptive loop counts base tiles and needs step 1, got `2`"),
    ("{max_range = 2, min_range = 2, ", "{", LOOP + r"an adaptive loop needs max_range and min_range"),
    ("tile_levels = {0: 32, 2: 64}}", "tile_levels = {0: 32, 2: 64}, reassociate = 1}",
     r"line 14: loop `%i`: reassociate must be true or false"),
    # the module
    ("entry @prog", "entry @main", r"^module: the entry `main` is not a function of the module$"),
    ("entry @prog", "entry @copy_tile", r"^module: the entry `copy_tile` is an InCore function"),
    ("  tile %t : [%R, 64] f32", "  tile %t : [%R, 64] f32\n  tile %u : [8, 8] f32",
     r"^`copy_tile`: tile `u` is declared but never used$"),
]


@pytest.mark.parametrize("old,new,msg", CASES, ids=[c[2][:60] for c in CASES])
def test_parse_module_verifies(old, new, msg):
    assert old in BASE
    src = BASE.replace(old, new)
    with pytest.raises((BuildError, ParseError)) as info:
        parse_module(src)
    text = str(info.value)
    assert "\n" not in text and re.search(msg, text), text


def test_the_base_text_is_a_program_and_unverified_parsing_keeps_what_it_read():
    m = parse_module(BASE)
    verify_module(m)
    assert parse_module(format_module(m)) == m
    bad = parse_module(BASE.replace("f32 output", "f32 input"), verify=False)
    assert bad.entry_function.tensor("y").role == "input"
    with pytest.raises(BuildError, match=r"writes parameter `y` but tensor `y` is an input"):
        verify_module(bad)


def test_duplicate_functions_and_names_the_registry_refuses():
    incore = BASE[:BASE.index("orchestration")]
    with pytest.raises(BuildError, match=r"^module: two functions are named `copy_tile`$"):
        parse_module(incore + BASE)
    for old, new, msg in [
        ("%n", "%min", r"scalar parameter name `min` in `prog` is a reserved word"),
        ("%n", "%__n", r"scalar parameter name `__n` in `prog` starts with `__`, which is kept for generated"),
        ("@copy_tile", "@copy__tile", r"InCore function name `copy__tile` contains `__`, which separates a variant"),
        ("%t", "%select", r"tile name `select` in `copy_tile` is a reserved word"),
    ]:
        with pytest.raises(BuildError, match=msg):
            parse_module(BASE.replace(old, new))


# ------------------------------------------------------------------ hand-made IR

def _base() -> Module:
    return parse_module(BASE)


def _with_loop(m: Module, **changes) -> Module:
    f = m.entry_function
    let_m, loop = f.body
    return Module((m["copy_tile"], replace(f, body=(let_m, replace(loop, **changes)))), m.entry)


def _with_call(m: Module, **changes) -> Module:
    loop = m.entry_function.body[1]
    let_r, call = loop.body
    return _with_loop(m, body=(let_r, replace(call, **changes)))


@pytest.mark.parametrize("make,msg", [
    (lambda m: _with_loop(m, body=()), r"^`prog`: loop `i` has an empty body$"),
    (lambda m: _with_loop(m, tile_levels=((0, 32), (0, 64), (2, 64))), LOOP + r"tile_levels gives a block size twice"),
    (lambda m: _with_loop(m, tile_levels=((0, 32, 1),)), LOOP + r"tile_levels must be pairs"),
    (lambda m: _with_loop(m, tile_levels=None, max_range=None, min_range=None, reassociate=True),
     LOOP + r"reassociate=True needs tile_levels"),
    (lambda m: _with_loop(m, tile_levels=None, min_range=None), LOOP + r"max_range/min_range need tile_levels"),
    (lambda m: _with_loop(m, body=(Instr(Op.EXP, "t", ("t",)),)), r"`prog`: Instr is not an orchestration statement"),
    (lambda m: _with_call(m, dims=(("R", as_expr(32)), ("R", as_expr(64)))), CALL + r"dim `R` is bound twice"),
    (lambda m: _with_call(m, args=(("x", RegionBinding("x", as_expr(0), as_expr(0), as_expr(32))),
                                   ("y", RegionBinding("y", as_expr(0), as_expr(0))))),
     CALL + r"region for `x` gives rows without cols"),
])
def test_verify_orch_on_hand_made_ir(make, msg):
    m = make(_base())
    with pytest.raises(BuildError) as info:
        verify_module(m)
    assert re.search(msg, str(info.value)), str(info.value)


def test_a_tensor_dtype_must_be_a_dtype_and_callees_may_be_a_dict():
    m = _base()
    f = m.entry_function
    verify_orch(f, {"copy_tile": m["copy_tile"]})
    bad = replace(f, tensors=(replace(f.tensors[0], dtype="f32"), f.tensors[1]))
    with pytest.raises(BuildError, match=r"^`prog`: tensor `x`: 'f32' is not a dtype$"):
        verify_orch(bad, m)
    with pytest.raises(BuildError, match=r"call to unknown function `copy_tile` \(known: none registered\)"):
        verify_orch(f, {})
    assert isinstance(f.tensors[0].dtype, DType)


# ------------------------------------------------------------------ builder and verifier agree

def _copy():
    k = InCore("copy_tile")
    R = k.dim("R", 32)
    x, y = k.memref("x", f32), k.memref("y", f32)
    t = k.tile("t", R, 64, f32)
    k.load(t, x, 0, 0)
    k.store(y, 0, 0, t)
    return k.build()


def _strip_loc(msg: str) -> str:
    return re.sub(r" \([\w.<>]+:\d+\)", "", msg)


def test_the_builder_and_the_text_are_refused_in_the_same_words():
    o = Orchestration("prog")
    n = o.scalar("n")
    x, y = o.input("x", n, 64, f32), o.input("y", n, 64, f32)
    m = o.let("m", (n + 31) // 32)
    with pytest.raises(BuildError) as built:
        with o.for_loop("i", 0, m, tile_levels={0: 32, 2: 64}) as i:
            r = o.let("r", emin(i.rows, n - i * 32))
            o.call(_copy(), {"x": (x, i * 32, 0, r, 64), "y": (y, i * 32, 0, r, 64)}, dims={"R": i.rows})
    assert re.search(r"`prog` \(test_verify\.py:\d+\): call to `copy_tile`", str(built.value))
    with pytest.raises(BuildError) as parsed:
        parse_module(BASE.replace("f32 output", "f32 input"))
    assert _strip_loc(str(built.value)) == _strip_loc(str(parsed.value))


def test_build_runs_the_whole_function_verifier():
    """build() verifies the function it returns: a tensor declared after the last call is
    caught there, by the same rule (and line) as in a parsed module."""
    o = Orchestration("prog")
    n = o.scalar("n")
    x, y = o.input("x", n, 64, f32), o.output("y", n, 64, f32)
    o.call(_copy(), {"x": x, "y": y})
    o.temp("spare", n, 64, f32)
    with pytest.raises(BuildError, match=r"^`prog`: tensor `spare` is declared but no call uses it$"):
        o.build()


@pytest.mark.parametrize("name", names())
def test_every_program_and_its_lowerings_verify(name):
    prog = get(name)
    m = prog.build(prog.settings())
    for mod in (m, expand_binary(m), strip_adaptive(m)):
        verify_module(mod)
        assert parse_module(format_module(mod)) == mod


# ------------------------------------------------------------------ names and expression text

def test_builders_check_names_with_the_registry():
    with pytest.raises(BuildError, match=r"InCore function name `copy__tile` contains `__`"):
        InCore("copy__tile")
    o = Orchestration("p")
    with pytest.raises(BuildError, match=r"scalar parameter name `__n` in `p` starts with `__`"):
        o.scalar("__n")
    with pytest.raises(BuildError, match=r"scalar name `bx_size` in `p` is a reserved word"):
        o.let("bx_size", 1)


def test_expression_text_is_parsed_by_the_builders_only():
    with pytest.raises(BuildError, match=r"got the text 'n \+ 1' \(the builders parse expression text"):
        as_expr("n + 1")
    o = Orchestration("p")
    n = o.scalar("n")
    assert o.let("m", "n * 2 + 1") is not None
    with pytest.raises(BuildError, match=r"^`p` \(test_verify\.py:\d+\): let `k`: expression 'n \+': line 1, col 4: "
                                         r"expected an expression, found end of input$"):
        o.let("k", "n +")
    assert parse_expr("min(n, 4) * 2") == emin(n, 4) * 2
    with pytest.raises(ParseError, match=r"expected an expression, found `nan`"):
        parse_expr("nan + 1")


def test_variant_names_are_built_from_data():
    f = _copy()
    from pto.ir.analysis import specialize

    v = specialize(f, {"R": 64})
    assert (v.name, v.variant) == ("copy_tile", (("R", 64),))
    assert v.variant_name == variant_name("copy_tile", (("R", 64),)) == "copy_tile__R64"
    assert base_name(v.variant_name) == v.name and f.variant_name == "copy_tile"
