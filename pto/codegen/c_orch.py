"""Orchestration function -> portable C99 that drives the runtime.

One source file per orchestration function, generated from the IR by small functions (one per
statement kind, one expression renderer); fixed C lives in runtime_c/ (pto_runtime.{h,c},
pto_orch.h). The generated file exports three functions (``NAME`` is the function's name)::

    int pto_NAME_info(int32_t *n_scalars, int32_t *n_tensors, int32_t *n_funcs);
    int pto_NAME_setup(pto_runtime *rt, const int64_t *scalars, int32_t *tensor_ids,
                       int32_t *func_ids);
    int pto_NAME_build(pto_runtime *rt, const int64_t *scalars, const int32_t *tensor_ids,
                       const int32_t *func_ids, int32_t *failed_call);
    const char *pto_NAME_call_site(int32_t k);

``setup`` registers the tensors (shapes from the scalars) and every InCore function variant
the program can call; ``build`` submits one task per call. On an error ``build`` returns the
runtime's status and stores the index of the failing call in ``failed_call``; ``call_site``
names it ("call to `rope_tile` (llama7b.py:212)").

Adaptive loops must be lowered first (pto.passes.expansion.binary_expansion). A call's callee variant is
chosen at run time among the finitely many its dims can take (a value-set analysis over the
lets, e.g. the tile heights of the enclosing expanded loops).
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field

from pto.codegen.c_expr import c_expr, strip_parens, value_set
from pto.errors import BuildError
from pto.ir.analysis import param_access, specialize, tile_bytes
from pto.ir.expr import Const, Expr, Var, substitute
from pto.ir.nodes import Call, If, IncoreFunction, Let, Loop, Module, OrchFunction, RegionBinding
from pto.version import __version__

# ---------------------------------------------------------------------------- the generator


@dataclass
class Variant:
    func: IncoreFunction  # specialized
    generic: IncoreFunction
    dims: tuple[tuple[str, int], ...]
    enum: str
    buffer_bytes: int


@dataclass
class COrchestration:
    """Generated C of one orchestration function and what Python needs to drive it."""

    name: str
    source: str
    cdef: str  # declarations for cffi
    scalars: tuple[str, ...]
    tensors: tuple[str, ...]
    variants: list[Variant]
    call_sites: list[str] = field(default_factory=list)

    @property
    def filename(self) -> str:
        return f"{self.name}.c"


class _Gen:
    def __init__(self, module: Module, fn: OrchFunction):
        self.module = module
        self.fn = fn
        self.lines: list[str] = []
        self.variants: dict[tuple, Variant] = {}
        self.call_sites: list[str] = []
        self.access_cache: dict[str, dict] = {}

    def out(self, ind: int, text: str) -> None:
        self.lines.append("    " * ind + text)

    def variant(self, f: IncoreFunction, dims: dict[str, int]) -> Variant:
        full = tuple(sorted({**dict(f.dims), **dims}.items()))
        key = (f.name, full)
        v = self.variants.get(key)
        if v is None:
            spec = specialize(f, dict(full))
            enum = "F_" + spec.variant_name
            v = Variant(spec, f, full, enum, sum(tile_bytes(spec).values()))
            self.variants[key] = v
        return v

    # statements --------------------------------------------------------------------------
    def body(self, stmts, ind: int, env: dict) -> None:
        for s in stmts:
            if isinstance(s, Let):
                env[s.name] = value_set(s.value, env)
                self.out(ind, f"const int64_t v_{s.name} = {strip_parens(c_expr(s.value))};")
            elif isinstance(s, Loop):
                if s.adaptive:
                    raise BuildError(f"loop `{s.var}` is adaptive; run binary expansion (or "
                                     "strip_adaptive) before generating C")
                v = f"v_{s.var}"
                step = c_expr(s.step)
                inner = dict(env)
                inner[s.var] = None
                self.out(ind, f"for (int64_t {v} = {strip_parens(c_expr(s.lb))}, {v}_end = "
                              f"{strip_parens(c_expr(s.ub))}; {v} < {v}_end; {v} += {strip_parens(step)}) {{")
                self.body(s.body, ind + 1, inner)
                self.out(ind, "}")
            elif isinstance(s, If):
                self.out(ind, f"if ({strip_parens(c_expr(s.cond))}) {{")
                self.body(s.then, ind + 1, dict(env))
                if s.orelse:
                    self.out(ind, "} else {")
                    self.body(s.orelse, ind + 1, dict(env))
                self.out(ind, "}")
            elif isinstance(s, Call):
                self.call(s, ind, env)
            else:  # pragma: no cover
                raise TypeError(s)

    def call(self, c: Call, ind: int, env: dict) -> None:
        f = self.module.get(c.func)
        if not isinstance(f, IncoreFunction):
            raise BuildError(f"call to unknown InCore function `{c.func}`")
        site = len(self.call_sites)
        where = f"call to `{c.func}`" + (f" ({c.loc})" if c.loc else "")
        self.call_sites.append(where)
        variants = self._call_variants(c, f, env, where)
        dim_exprs = dict(c.dims)
        comment = f"/* {c.func}" + (f" ({c.loc})" if c.loc else "") + " */"
        self.out(ind, "{")
        self.out(ind + 1, comment)
        dims_at = len(self.lines)  # the dim variables the call's code uses go here
        if len(variants) == 1:
            fexpr = variants[0].enum
        else:
            fexpr = variants[-1].enum
            for v in reversed(variants[:-1]):
                cond = " && ".join(f"d_{k} == {val}" for k, val in v.dims if k in dim_exprs)
                fexpr = f"({cond}) ? {v.enum} : {fexpr}"
        self.out(ind + 1, f"const int32_t f = {strip_parens(fexpr) if len(variants) > 1 else fexpr};")
        self.out(ind + 1, f"PTO_CALL({site}, pto_task_alloc(rt, func_ids[f], func_buffer_bytes[f], &task));")
        self._call_args(c, f, ind, site)
        self.out(ind + 1, f"PTO_CALL({site}, pto_task_submit(rt, task));")
        self.out(ind, "}")
        body = "\n".join(self.lines[dims_at:])
        used = [f"{'    ' * (ind + 1)}const int64_t d_{k} = {strip_parens(c_expr(e))};"
                for k, e in c.dims if re.search(rf"\bd_{k}\b", body)]
        self.lines[dims_at:dims_at] = used

    def _call_variants(self, c: Call, f: IncoreFunction, env: dict, where: str) -> list:
        """The variants of ``f`` the call can select: one per combination of the values its dims
        take (each must be known at compile time)."""
        dim_exprs = dict(c.dims)
        choices = []
        for k, _ in f.dims:
            if k in dim_exprs:
                vs = value_set(dim_exprs[k], env)
                if vs is None:
                    raise BuildError(f"{where}: dim `{k}` = `{dim_exprs[k]}` must take values known at "
                                     "compile time (constants or tile heights of adaptive loops)")
                choices.append([(k, int(x)) for x in sorted(vs)])
        combos = [dict(x) for x in itertools.product(*choices)] if choices else [{}]
        return [self.variant(f, d) for d in combos]

    def _call_args(self, c: Call, f: IncoreFunction, ind: int, site: int) -> None:
        """The task's regions (direction from the callee's accesses) and scalars, in order."""
        access = self.access_cache.get(f.name)
        if access is None:
            access = self.access_cache[f.name] = param_access(f)
        args, dim_exprs = dict(c.args), dict(c.dims)
        # callee dims and scalar parameters, in the caller's terms
        mapping: dict[str, Expr] = {k: Var(f"__d_{k}") for k, _ in f.dims}
        for k, _ in f.dims:
            if k not in dim_exprs:
                mapping[k] = Const(dict(f.dims)[k])
        for p in f.scalars:
            mapping[p.name] = args[p.name]

        def name(n: str) -> str:
            return "d_" + n[4:] if n.startswith("__d_") else "v_" + n

        for p in f.params:
            v = args[p.name]
            if isinstance(v, RegionBinding):
                acc = access[p.name]
                rows = v.rows if v.rows is not None else substitute(acc.rows, mapping)
                cols = v.cols if v.cols is not None else substitute(acc.cols, mapping)
                fn_name = {"in": "pto_task_add_input", "out": "pto_task_add_output",
                           "inout": "pto_task_add_inout"}[acc.direction]
                parts = [c_expr(x, name) for x in (v.row, v.col, rows, cols)]
                self.out(ind + 1, f"PTO_CALL({site}, {fn_name}(rt, task, tensor_ids[T_{v.tensor}], "
                                  f"{', '.join(strip_parens(x) for x in parts)}));")
            else:
                self.out(ind + 1, f"PTO_CALL({site}, pto_task_add_scalar(rt, task, {strip_parens(c_expr(v))}));")

    # file ----------------------------------------------------------------------------------
    def generate(self) -> COrchestration:
        fn = self.fn
        body_start = len(self.lines)
        self.body(fn.body, 1, {s: None for s in fn.scalars})
        body = self.lines[body_start:]
        self.lines = self.lines[:body_start]
        variants = list(self.variants.values())
        decl = c_declarations(fn.name)
        src = self._header() + self._tables(variants) + self._functions(decl, variants, body)
        cdef = "\n".join(d + ";" for d in decl.values()) + "\n"
        return COrchestration(fn.name, "\n".join(src), cdef, tuple(fn.scalars),
                              tuple(t.name for t in fn.tensors), variants, list(self.call_sites))

    def _header(self) -> list[str]:
        """The file's comment, includes and the macro that records a failing call."""
        name = self.fn.name
        where = f" from {self.fn.loc}" if self.fn.loc else ""
        return [
            f"/* {name}.c - orchestration of `{name}`, generated by pto {__version__}{where}.",
            " *",
            f" * Submits one task per call of `{name}` to the pto runtime. Do not edit: regenerate",
            " * with `pto codegen`. Builds with the runtime's .c files: cc -O2 -Wall -Wextra -Werror *.c",
            " */",
            '#include "pto_runtime.h"',
            '#include "pto_orch.h"',
            "",
            "/* record the failing call and return the runtime's status */",
            "#define PTO_CALL(site, expr)            \\",
            "    do {                                \\",
            "        st = (expr);                    \\",
            "        if (st != PTO_OK) {             \\",
            "            *failed_call = (site);      \\",
            "            return st;                  \\",
            "        }                               \\",
            "    } while (0)",
            "",
        ]

    def _tables(self, variants: list[Variant]) -> list[str]:
        """The scalars (a comment), the tensor and variant enums, the variants' names and buffer
        bytes, the call sites."""
        fn = self.fn
        return [
            "/* scalar parameters, in order */",
            *[f"/*   scalars[{i}] = {s} */" for i, s in enumerate(fn.scalars)],
            "",
            "/* tensors */",
            "enum {",
            *[f"    T_{t.name} = {i}," for i, t in enumerate(fn.tensors)],
            "};",
            "",
            "/* InCore function variants */",
            "enum {",
            *[f"    {v.enum} = {i}," for i, v in enumerate(variants)],
            "};",
            "",
            "static const char *const func_names[] = {",
            *[f'    "{v.func.variant_name}",' for v in variants],
            "};",
            "",
            "/* bytes of the tiles each variant declares (its InCore buffer) */",
            "static const int32_t func_buffer_bytes[] = {",
            *[f"    {v.buffer_bytes}," for v in variants],
            "};",
            "",
            "static const char *const call_sites[] = {",
            *[f'    "{_c_string(s)}",' for s in self.call_sites],
            "};",
            "",
        ]

    def _functions(self, decl: dict[str, str], variants: list[Variant], body: list[str]) -> list[str]:
        """The functions the runtime calls: info, call_site, setup (tensors and variants
        registered) and build (``body``: one submission per call)."""
        fn = self.fn
        src = [
            decl["info"] + " {",
            f"    *n_scalars = {len(fn.scalars)};",
            f"    *n_tensors = {len(fn.tensors)};",
            f"    *n_funcs = {len(variants)};",
            "    return PTO_OK;",
            "}",
            "",
            decl["call_site"] + " {",
            f"    if (k < 0 || k >= {len(self.call_sites)}) return \"\";",
            "    return call_sites[k];",
            "}",
            "",
            decl["setup"] + " {",
            "    int st;",
            *self._scalar_lets(fn),
        ]
        for t in fn.tensors:
            rows, cols = strip_parens(c_expr(t.rows)), strip_parens(c_expr(t.cols))
            src.append(f'    st = pto_tensor_register(rt, "{t.name}", {rows}, {cols}, {t.dtype.itemsize}, '
                       f"&tensor_ids[T_{t.name}]);")
            src.append("    if (st != PTO_OK) return st;")
        return src + [
            f"    for (int32_t k = 0; k < {len(variants)}; k++) {{",
            "        st = pto_func_register(rt, func_names[k], &func_ids[k]);",
            "        if (st != PTO_OK) return st;",
            "    }",
            "    return PTO_OK;",
            "}",
            "",
            decl["build"] + " {",
            "    int st = PTO_OK;",
            "    int32_t task = -1;",
            *self._scalar_lets(fn),
            *body,
            "    (void)task;",
            "    return st;",
            "}",
            "",
        ]

    @staticmethod
    def _scalar_lets(fn: OrchFunction) -> list[str]:
        out = [f"    const int64_t v_{s} = scalars[{i}];" for i, s in enumerate(fn.scalars)]
        out += [f"    (void)v_{s};" for s in fn.scalars]
        return out


def _c_string(s: str) -> str:
    return s.replace("\\", "\\\\").replace('"', '\\"')


def c_declarations(name: str) -> dict[str, str]:
    return {
        "info": f"int pto_{name}_info(int32_t *n_scalars, int32_t *n_tensors, int32_t *n_funcs)",
        "call_site": f"const char *pto_{name}_call_site(int32_t k)",
        "setup": (f"int pto_{name}_setup(pto_runtime *rt, const int64_t *scalars, int32_t *tensor_ids, "
                  "int32_t *func_ids)"),
        "build": (f"int pto_{name}_build(pto_runtime *rt, const int64_t *scalars, const int32_t *tensor_ids, "
                  "const int32_t *func_ids, int32_t *failed_call)"),
    }


def generate_c(module: Module, name: str | None = None) -> COrchestration:
    """Generate the C of orchestration function ``name`` (the entry by default). Adaptive loops
    must have been lowered (expand_binary or strip_adaptive)."""
    fn = module[name or module.entry]
    if not isinstance(fn, OrchFunction):
        raise BuildError(f"`{fn.name}` is not an orchestration function")
    return _Gen(module, fn).generate()
