"""The text form: every program of the repository prints and parses back to an equal module;
expressions round-trip; parse errors say where."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pto import parse_expr, parse_module
from pto.errors import BuildError, ParseError, UsageError
from pto.ir.analysis import specialize
from pto.ir.expr import Const, Var, binop, emax, emin, evaluate, select
from pto.machine.target import get as target
from pto.programs import get, names
from pto.text import format_expr, format_module

PROGRAMS = names()


def _configs(name):
    """Every config and dtype, and every value of every option the program has (the LLaMA
    layer: every attention mode, causal or not)."""
    import contextlib
    import itertools

    prog = get(name)
    choices = {o.name: o.choices or ((True, False) if isinstance(o.default, bool) else (o.default,))
               for o in prog.options}
    combos = [dict(zip(choices, vals)) for vals in itertools.product(*choices.values())]
    out = []
    for config in prog.configs:
        for dtype in ("f32", "bf16"):
            for opts in combos:
                # a combination the program refuses (a fusion another mode lacks) is skipped
                with contextlib.suppress(UsageError):
                    out.append(prog.settings(config=config, dtype=dtype, target=target("cuda_h100"), **opts))
    return out


@pytest.mark.parametrize("name", PROGRAMS)
def test_round_trip_every_program(name):
    """Each distinct module the program builds under :func:`_configs` prints, parses back equal
    and prints the same (settings that build the same text, most of the model program's 1,224,
    are parsed once: its 102 modules)."""
    prog = get(name)
    seen = set()
    for opts in _configs(name):
        m = prog.build(opts)
        text = format_module(m)
        if text in seen:
            continue
        seen.add(text)
        back = parse_module(text)
        assert back == m
        assert format_module(back) == text


@pytest.mark.parametrize("name", PROGRAMS)
def test_round_trip_specialized_variants(name):
    prog = get(name)
    m = prog.build(prog.settings())
    for f in m.incore_functions:
        spec = specialize(f)
        from pto.ir.nodes import Module

        # a variant beside calls that still bind its dims is no program: only the text form is
        # checked here, so the parse is not verified
        mod = Module((spec, *[g for g in m.functions if g.name != f.name]), m.entry)
        assert parse_module(format_module(mod), verify=False) == mod


def test_parse_error_says_where():
    src = "incore @f {\n  param %x : memref f32\n  tile %t : [8 8] f32\n}\nentry @f\n"
    with pytest.raises(ParseError, match=r"line 3, col 16: expected `,`, found `8`"):
        parse_module(src)


def test_unknown_instruction():
    src = "incore @f {\n  param %x : memref f32\n  frobnicate %x\n}\nentry @f\n"
    with pytest.raises(ParseError, match=r"unknown instruction `frobnicate`"):
        parse_module(src)


_names = st.sampled_from(["a", "b", "n"])
_leaf = st.one_of(st.integers(-50, 50).map(Const), _names.map(Var))


def _safe(make):
    def go(args):
        try:
            return make(*args)
        except BuildError:  # a constant division by zero is refused while building
            return None

    return go


def _tree(children):
    ops = st.sampled_from(["+", "-", "*", "//", "%", "<", "<=", ">", ">=", "==", "!=", "and", "or",
                           "min", "max"])
    return st.one_of(
        st.tuples(ops, children, children).map(_safe(binop)).filter(lambda e: e is not None),
        st.tuples(children, children, children).map(_safe(select)).filter(lambda e: e is not None),
    )


exprs = st.recursive(_leaf, _tree, max_leaves=12)


@settings(max_examples=300, deadline=None)
@given(exprs, st.integers(-20, 20), st.integers(1, 20), st.integers(-20, 20))
def test_expression_round_trip_and_value(e, a, b, n):
    text = format_expr(e)
    back = parse_expr(text)
    assert back == e, text
    env = {"a": a, "b": b, "n": n}
    try:
        v = evaluate(e, env)
    except ZeroDivisionError:
        return
    assert evaluate(back, env) == v


def test_bare_names_and_functions():
    e = parse_expr("min(tile_i * 32, n - 1) + max(a, b, 3)")
    assert e == binop("+", emin(Var("tile_i") * 32, Var("n") - 1), emax(Var("a"), Var("b"), 3))
    assert evaluate(parse_expr("-7 // 2"), {}) == -4  # floor division, as in Python
    assert evaluate(parse_expr("-7 % 3"), {}) == 2
