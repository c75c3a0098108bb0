"""Expressions of the IR as C, and the values an expression can take (the generated
orchestration's pieces that are not statements: :mod:`pto.codegen.c_orch`, :mod:`pto.codegen.c_main`)."""

from __future__ import annotations

import itertools

from pto.errors import BuildError
from pto.ir.expr import Attr, Bin, Const, Expr, Fn, Var, evaluate

_C_BIN = {"+": "+", "-": "-", "*": "*", "<": "<", "<=": "<=", ">": ">", ">=": ">=", "==": "==",
          "!=": "!=", "and": "&&", "or": "||"}
_C_FN = {"//": "pto_fdiv", "%": "pto_fmod", "min": "pto_min", "max": "pto_max"}
_C_INTRINSIC = {"bx_count": "pto_bx_count", "bx_start": "pto_bx_start", "bx_size": "pto_bx_size"}


def c_expr(e: Expr, name=lambda n: "v_" + n, leaf=None) -> str:
    """C text of an integer expression; ``name`` maps variable names to C identifiers; ``leaf``,
    where given, renders the nodes it returns text for (an InCore function's ``x.rows``, its
    float constants) before the rules below."""
    if leaf is not None:
        text = leaf(e)
        if text is not None:
            return text
    if isinstance(e, Const):
        if not isinstance(e.value, int):
            raise BuildError(f"orchestration expressions are integers; got the constant {e.value!r}")
        v = e.value
        return f"INT64_C({v})" if abs(v) >= 2**31 else str(v)
    if isinstance(e, Var):
        return name(e.name)
    if isinstance(e, Attr):
        raise BuildError(f"`{e.base}.{e.field}` reached C code generation; lower adaptive loops first")
    if isinstance(e, Fn):
        args = [c_expr(a, name, leaf) for a in e.args]
        if e.name == "select":
            return f"({args[0]} ? {args[1]} : {args[2]})"
        return f"{_C_INTRINSIC[e.name]}({', '.join(args)})"
    if isinstance(e, Bin):
        a, b = c_expr(e.a, name, leaf), c_expr(e.b, name, leaf)
        if e.op in _C_FN:
            return f"{_C_FN[e.op]}({a}, {b})"
        return f"({a} {_C_BIN[e.op]} {b})"
    raise TypeError(e)


def strip_parens(s: str) -> str:
    """Drop the outermost parentheses of a rendered expression, for readability."""
    if s.startswith("(") and s.endswith(")"):
        depth = 0
        for i, ch in enumerate(s):
            depth += ch == "("
            depth -= ch == ")"
            if depth == 0 and i < len(s) - 1:
                return s
        return s[1:-1]
    return s


# ---------------------------------------------------------------------------- value sets

_MAX_SET = 256


def value_set(e: Expr, env: dict[str, frozenset | None]) -> frozenset | None:
    """The finite set of values ``e`` can take, or None when unknown at compile time."""
    if isinstance(e, Const):
        return frozenset({e.value})
    if isinstance(e, Var):
        return env.get(e.name)
    if isinstance(e, Fn) and e.name == "select":
        a, b = value_set(e.args[1], env), value_set(e.args[2], env)
        return None if a is None or b is None else a | b
    parts = [e.a, e.b] if isinstance(e, Bin) else list(e.args) if isinstance(e, Fn) else None
    if parts is None:
        return None
    sets = [value_set(p, env) for p in parts]
    if any(s is None for s in sets):
        return None
    size = 1
    for s in sets:
        size *= len(s)
    if size > _MAX_SET:
        return None
    out = set()
    names = [f"_{i}" for i in range(len(parts))]
    templ = e.__class__(e.op, Var(names[0]), Var(names[1])) if isinstance(e, Bin) else \
        Fn(e.name, tuple(Var(n) for n in names))
    for combo in itertools.product(*sets):
        try:
            out.add(evaluate(templ, dict(zip(names, combo))))
        except ZeroDivisionError:
            continue
    return frozenset(out)


__all__ = ["c_expr", "strip_parens", "value_set"]
