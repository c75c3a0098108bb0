"""Print a Module as its text form (the seed's ``.pto`` assembly idea).

The text parses back (:mod:`pto.text.parser`) to an equal module. Values are written ``%name``,
functions ``@name``; one instruction or statement per line; attributes in ``{...}``; source
locations as ``loc "file:line"``. See docs/ARCHITECTURE.md for the grammar.
"""

from __future__ import annotations

from pto.ir.expr import format_expr, format_number
from pto.ir.nodes import (
    Call,
    ForRange,
    If,
    IncoreFunction,
    Instr,
    Let,
    Loop,
    MemRefParam,
    Module,
    OrchFunction,
    RegionBinding,
)
from pto.ir.ops import SIGNATURE, STORES, Op


def _attr_value(v) -> str:
    if isinstance(v, (bool, int, float)):
        return format_number(v)
    if isinstance(v, str):
        return v
    if isinstance(v, tuple):  # tile_levels
        return "{" + ", ".join(f"{k}: {h}" for k, h in v) + "}"
    raise TypeError(v)


def _attrs(items) -> str:
    if not items:
        return ""
    return " {" + ", ".join(f"{k} = {_attr_value(v)}" for k, v in items) + "}"


def _loc(loc: str | None) -> str:
    return f' loc "{loc}"' if loc else ""


def format_instr(ins: Instr) -> str:
    if ins.op is Op.LOAD:
        mem, row, col = ins.srcs
        body = f"load %{ins.dst}, %{mem}[{format_expr(row)}, {format_expr(col)}]"
    elif ins.op in STORES:
        tile, mem, row, col = ins.srcs
        body = f"{ins.op.value} %{mem}[{format_expr(row)}, {format_expr(col)}], %{tile}"
    elif ins.op is Op.LOAD_SCALAR:
        mem, row, col = ins.srcs
        body = f"load_scalar %{ins.dst}, %{mem}[{format_expr(row)}, {format_expr(col)}]"
    else:
        kinds = SIGNATURE[ins.op][0]
        ops = [f"%{ins.dst}"]
        for k, s in zip(kinds, ins.srcs):
            ops.append(f"%{s}" if k in "TM" else format_expr(s))
        body = f"{ins.op.value} {', '.join(ops)}"
    return body + _attrs(ins.attrs) + _loc(ins.loc)


def _incore_lines(fn: IncoreFunction) -> list[str]:
    head = f"incore @{fn.name}"
    if fn.dims:
        head += " dims(" + ", ".join(f"%{k} = {v}" for k, v in fn.dims) + ")"
    if fn.variant:
        head += " variant(" + ", ".join(f"%{k} = {v}" for k, v in fn.variant) + ")"
    lines = [head + _loc(fn.loc) + " {"]
    for p in fn.params:
        if isinstance(p, MemRefParam):
            shp = "" if p.shape is None else f" [{format_expr(p.shape[0])}, {format_expr(p.shape[1])}]"
            lines.append(f"  param %{p.name} : memref {p.dtype}{shp}")
        else:
            lines.append(f"  param %{p.name} : scalar")
    for t in fn.tiles:
        lines.append(f"  tile %{t.name} : [{format_expr(t.rows)}, {format_expr(t.cols)}] {t.dtype}")
    if fn.parallel is not None:
        lines.append(f"  parallel %{fn.parallel.var} < {format_expr(fn.parallel.extent)}")

    def body(stmts, ind):
        for s in stmts:
            if isinstance(s, ForRange):
                lines.append(f"{ind}for %{s.var} = {format_expr(s.lb)} to {format_expr(s.ub)} "
                             f"step {format_expr(s.step)} {{")
                body(s.body, ind + "  ")
                lines.append(ind + "}")
            else:
                lines.append(ind + format_instr(s))

    body(fn.body, "  ")
    lines.append("}")
    return lines


def _binding(v: RegionBinding) -> str:
    parts = [format_expr(v.row), format_expr(v.col)]
    if v.rows is not None:
        parts += [format_expr(v.rows), format_expr(v.cols)]
    return f"%{v.tensor}[{', '.join(parts)}]"


def format_call(c: Call) -> str:
    args = []
    for k, v in c.args:
        args.append(f"{k} = {_binding(v) if isinstance(v, RegionBinding) else format_expr(v)}")
    s = f"call @{c.func}({', '.join(args)})"
    if c.dims:
        s += " dims(" + ", ".join(f"{k} = {format_expr(v)}" for k, v in c.dims) + ")"
    return s + _loc(c.loc)


def _orch_lines(fn: OrchFunction) -> list[str]:
    lines = [f"orchestration @{fn.name}{_loc(fn.loc)} {{"]
    for s in fn.scalars:
        lines.append(f"  scalar %{s}")
    for t in fn.tensors:
        shape = f"[{format_expr(t.rows)}, {format_expr(t.cols)}]"
        lines.append(f"  tensor %{t.name} : {shape} {t.dtype} {t.role}")

    def body(stmts, ind):
        for s in stmts:
            if isinstance(s, Let):
                lines.append(f"{ind}let %{s.name} = {format_expr(s.value)}")
            elif isinstance(s, Call):
                lines.append(ind + format_call(s))
            elif isinstance(s, Loop):
                attrs = []
                if s.tile_levels is not None:
                    attrs = [("max_range", s.max_range), ("min_range", s.min_range),
                             ("tile_levels", s.tile_levels)]
                    if s.reassociate:
                        attrs.append(("reassociate", True))
                lines.append(f"{ind}for %{s.var} = {format_expr(s.lb)} to {format_expr(s.ub)} "
                             f"step {format_expr(s.step)}{_attrs(attrs)} {{")
                body(s.body, ind + "  ")
                lines.append(ind + "}")
            elif isinstance(s, If):
                lines.append(f"{ind}if {format_expr(s.cond)} {{")
                body(s.then, ind + "  ")
                if s.orelse:
                    lines.append(ind + "} else {")
                    body(s.orelse, ind + "  ")
                lines.append(ind + "}")
            else:
                raise TypeError(s)

    body(fn.body, "  ")
    lines.append("}")
    return lines


def format_function(fn) -> str:
    lines = _incore_lines(fn) if isinstance(fn, IncoreFunction) else _orch_lines(fn)
    return "\n".join(lines) + "\n"


def format_module(m: Module) -> str:
    parts = [format_function(f) for f in m.functions]
    return "\n".join(parts) + f"\nentry @{m.entry}\n"


__all__ = ["format_expr", "format_number", "format_module", "format_function", "format_instr", "format_call"]
