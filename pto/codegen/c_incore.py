"""InCore functions -> portable C99: the native backend's kernels (the Triton renderer's C sibling,
from the same IR and op table).

Every specialized variant renders as one ``static int k_<variant>(const pto_region *m, const
int64_t *s, float *scratch)`` (the calling convention of ``runtime_c/pto_kernel_abi.h``): ``m``
the task's memref regions and ``s`` its scalars, in parameter order, ``scratch`` 64-byte
aligned room for its tiles. The parallel axis is a loop around the body; loops are C loops with
the evaluator's trip counts; scalar expressions are int64 C with Python's floor division
(``pto_orch.h``). The tile instructions are :mod:`pto.codegen.c_tileops` (the numerics contract
is there); what they compute with is ``runtime_c/pto_tile.h``.

One file holds the variants of a module (:func:`render_incore`), with two entry points:
``pto_<name>_kernel(k)`` (variant ``k``'s :c:type:`pto_kernel_info`, which the native pool binds
to its function id) and ``pto_<name>_run(k, mems, scalars, n)`` (run ``n`` tasks of variant ``k``
one after another, for a batch of the wave executor and for tests).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pto.codegen.c_expr import c_expr, strip_parens
from pto.codegen.c_quant import render_helpers
from pto.codegen.c_tileops import C_TYPE, ROUND, CTileOps, c_float, rounded
from pto.errors import BuildError
from pto.ir.analysis import DOT_ROWS, gemv_quantized_loads, instr_reads, param_access, tile_shape
from pto.ir.dtypes import DType
from pto.ir.expr import Attr, Const, Expr, const_value
from pto.ir.nodes import ForRange, IncoreFunction, Instr, walk_instrs
from pto.ir.ops import STORES, Op
from pto.version import __version__

ALIGN_FLOATS = 16  # 64 bytes: every tile starts on a cache line (and a full AVX-512 vector)


@dataclass(frozen=True)
class CKernel:
    """One variant's kernel: its C symbol, the scratch it needs and its argument counts."""

    variant: str
    symbol: str
    scratch_floats: int
    n_mems: int
    n_scalars: int


@dataclass(frozen=True)
class CIncore:
    """The generated C of a set of variants and what Python needs to call it."""

    name: str
    source: str
    kernels: tuple[CKernel, ...]

    @property
    def filename(self) -> str:
        return f"{self.name}_incore.c"

    @property
    def cdef(self) -> str:
        """The entry points' declarations (the types are ``pto_kernel_abi.h``'s)."""
        return "\n".join(d + ";" for d in entry_declarations(self.name).values()) + "\n"


def entry_declarations(name: str) -> dict[str, str]:
    return {
        "kernel": f"const pto_kernel_info *pto_{name}_kernel(int32_t k)",
        "run": f"int pto_{name}_run(int32_t k, const pto_region *mems, const int64_t *scalars, int64_t n_tasks)",
    }


# tile dataflow ---------------------------------------------------------------------------------


def first_access(body, tile: str) -> str | None:
    """"read" if ``tile`` may be read in ``body`` before being written, "write" if it is written
    first on every path, None if the body leaves it alone (loops may run zero times)."""
    for s in body:
        if isinstance(s, ForRange):
            if first_access(s.body, tile) == "read":
                return "read"
        else:
            if tile in instr_reads(s):
                return "read"
            if s.dst == tile:
                return "write"
    return None


def _stores(s) -> bool:
    return any(i.op in STORES for i in (walk_instrs((s,)) if isinstance(s, ForRange) else (s,)))


def view_tiles(fn: IncoreFunction) -> frozenset[str]:
    """Tiles that may point at the memory they were loaded from: f32 tiles written only by
    (unstrided) loads of f32 memrefs the function only reads, each read of them after a load of
    theirs in its own statement list (or an enclosing one, where the loop in between stores
    nothing) with no store in between. A store in between might write what the load read (two
    memrefs may be bound to one tensor: an in-place residual), which a copy would not see."""
    access = param_access(fn)
    dtypes = {t.name: t.dtype for t in fn.tiles}
    mems = {p.name: p for p in fn.memrefs}
    ok = {t for t, dt in dtypes.items() if dt is DType.F32}
    for ins in walk_instrs(fn.body):
        if ins.dst in ok and not (ins.op is Op.LOAD and int(ins.attr("step")) == 1
                                  and mems[ins.srcs[0]].dtype is DType.F32 and access[ins.srcs[0]].direction == "in"):
            ok.discard(ins.dst)

    def visit(body, open_: set[str]) -> None:
        for s in body:
            if isinstance(s, ForRange):  # its reads are checked inside, from what is open here
                visit(s.body, set() if _stores(s) else set(open_))
            else:
                ok.difference_update(instr_reads(s) - open_)
            if _stores(s):
                open_.clear()
            if isinstance(s, Instr) and s.op is Op.LOAD:
                open_.add(s.dst)
            elif isinstance(s, ForRange):  # after a loop, its tiles hold what an unknown iteration left
                open_.difference_update(i.dst for i in walk_instrs(s.body) if i.dst is not None)

    visit(fn.body, set())
    return frozenset(ok)


# the renderer ------------------------------------------------------------------------------------


class KernelRenderer(CTileOps):
    """Walks a specialized InCore function into the C lines of its kernel."""

    def __init__(self, fn: IncoreFunction):
        if fn.dims:
            raise BuildError(f"`{fn.name}` still has dims {dict(fn.dims)}; specialize it first")
        self.fn = fn
        dims = dict(fn.variant)
        self.shapes = {t.name: tile_shape(t, dims) for t in fn.tiles}
        self.dtypes = {t.name: t.dtype for t in fn.tiles}
        self.memrefs = {p.name: p for p in fn.memrefs}
        self.mem_index = {p.name: k for k, p in enumerate(fn.memrefs)}
        self.access = param_access(fn)
        self.views = view_tiles(fn)
        self.names: dict[str, str] = {p.name: f"s_{p.name}" for p in fn.scalars}
        self.symbol = "k_" + fn.variant_name
        self.lines: list[str] = []
        self.depth = 1
        self.temp_floats = 0
        self.pack_floats = 0
        self.group: dict | None = None  # lane-wise instructions waiting for one shared loop (lanewise)
        #: quantized tiles a GEMV takes as stored (CTileOps.gemv_quantized): never made
        self.fused = gemv_quantized_loads(fn, lambda a: self.shapes[a][0] <= DOT_ROWS)
        #: where a fused tile's load reads (its memref, row and column offsets)
        self.fused_at: dict[str, tuple[str, str, str]] = {}

    # output ------------------------------------------------------------------------------------
    def emit(self, line: str) -> None:
        if self.group is not None:  # a line of anything else ends a group of lane-wise instructions
            self.flush()
        self.lines.append("    " * self.depth + line)

    def open_loop(self, var: str, n: int, start: int = 0) -> None:
        self.emit(f"for (int64_t {var} = {start}; {var} < {n}; {var}++) {{")
        self.depth += 1

    def close(self) -> None:
        self.depth -= 1
        self.emit("}")

    def temp(self, floats: int) -> str:
        """The kernel's temporary row (one op's partial results at a time)."""
        self.temp_floats = max(self.temp_floats, floats)
        return "tmp_"

    def pack(self, floats: int) -> str:
        """Room for a transposed matmul operand gathered contiguously."""
        self.pack_floats = max(self.pack_floats, floats)
        return "pack_"

    # scalars -----------------------------------------------------------------------------------
    def _name(self, n: str) -> str:
        if n not in self.names:
            raise BuildError(f"`{self.fn.variant_name}`: `{n}` has no value in the C kernel")
        return self.names[n]

    def _leaf(self, e: Expr) -> str | None:
        if isinstance(e, Attr):
            if e.base not in self.memrefs or e.field not in ("rows", "cols"):
                raise BuildError(f"`{self.fn.variant_name}`: `{e.base}.{e.field}` has no value in the C kernel")
            return f"m_{e.base}_{e.field}"
        if isinstance(e, Const) and isinstance(e.value, float):
            return f"({float(e.value).hex()})"
        return None

    def expr(self, e: Expr) -> str:
        """C text of a scalar expression (int64, Python's floor division)."""
        return c_expr(e, self._name, self._leaf)

    def scalar_f32(self, e: Expr) -> str:
        """A tile-scalar operand as f32 (the evaluator converts it with torch.as_tensor(f32))."""
        v = const_value(e)
        if v is not None:
            return c_float(rounded(float(v), DType.F32))
        return f"(float)({strip_parens(self.expr(e))})"

    def scalar_name(self, name: str) -> str:
        self.names[name] = f"l_{name}"
        return self.names[name]

    # tiles -------------------------------------------------------------------------------------
    def src(self, tile: str) -> tuple[str, str]:
        """``(pointer, row stride)`` to read ``tile`` through."""
        if tile in self.views:
            return f"p_{tile}", f"ld_{tile}"
        return f"t_{tile}", str(self.shapes[tile][1])

    def lanewise(self, dst: str, value: str, srcs: dict[str, tuple[str, str]], flat: bool = True) -> None:
        """``dst[i, j] = value`` rounded to dst's dtype, over dst's shape; ``value`` names the
        elements of ``srcs`` (placeholder -> (tile, "full" | "row": an R x 1 vector | "col": a
        1 x C vector)) and may use ``i`` and ``j`` (then ``flat`` is False).

        Consecutive lane-wise instructions over one shape share one loop (:meth:`flush` emits
        it at the next other line): each element's values stay in registers from one to the next
        and every tile is still written. It computes what the instructions one after another do,
        because each reads its sources at the element it writes (a vector operand has another
        shape, so nothing of the group writes it)."""
        r, c = self.shapes[dst]
        flat = flat and all(how == "full" and t not in self.views and self.shapes[t] == (r, c)
                            for t, how in srcs.values())
        group = self.group
        if group is not None and group["shape"] != (r, c):
            self.flush()
            group = None
        if group is None:
            group = self.group = {"shape": (r, c), "flat": True, "depth": self.depth, "members": []}
        group["flat"] = group["flat"] and flat
        group["members"].append((dst, value, srcs))

    def flush(self) -> None:
        """Emit the pending group of lane-wise instructions (:meth:`lanewise`) as one loop."""
        group, self.group = self.group, None
        if group is None:
            return
        (r, c), flat = group["shape"], group["flat"]
        depth, self.depth = self.depth, group["depth"]
        if flat:
            self.open_loop("e", r * c)
        else:
            self.open_loop("i", r)
            self.open_loop("j", c)
        for dst, value, srcs in group["members"]:
            text = value
            for key, (tile, how) in srcs.items():
                ptr, ld = self.src(tile)
                read = f"{ptr}[e]" if flat else {"full": f"{ptr}[i * {ld} + j]", "row": f"{ptr}[i * {ld}]",
                                                 "col": f"{ptr}[j]"}[how]
                text = text.replace("{" + key + "}", f"({read})")
            self.emit(f"t_{dst}[{'e' if flat else f'i * {c} + j'}] = {ROUND[self.dtypes[dst]].format(x=text)};")
        self.close()
        if not flat:
            self.close()
        self.depth = depth

    # structure ---------------------------------------------------------------------------------
    def render(self) -> tuple[CKernel, list[str]]:
        fn = self.fn
        body_lines = self._instance_body()
        offsets, total = self._layout()
        head = self._declarations(offsets)
        text = "\n".join(body_lines)
        used = [d for name, d in head if re.search(rf"\b{re.escape(name)}\b", text)]
        # a view's row stride that only the loads set (a one-row tile): read once, for -Wextra
        used += [f"    (void)ld_{t};" for t in sorted(self.views)
                 if re.search(rf"\bld_{t}\b", text) and not re.search(rf"\bld_{t}\b(?! =)", text)]
        unused_params = [f"    (void){p};" for p in ("m", "s", "scratch")
                         if not re.search(rf"\b{p}\b", text + "\n".join(used))]
        where = f" ({fn.loc})" if fn.loc else ""
        lines = [f"/* {fn.variant_name}{where} */",
                 f"static int {self.symbol}(const pto_region *m, const int64_t *s, float *scratch)", "{",
                 *used, *unused_params, *body_lines, "    return PTO_OK;", "}", ""]
        kernel = CKernel(fn.variant_name, self.symbol, total, len(fn.memrefs), len(fn.scalars))
        return kernel, lines

    def _instance_body(self) -> list[str]:
        """The body once per index of the parallel axis, tiles read before written set to NaN
        first (the evaluator's tiles start as NaN)."""
        fn = self.fn
        if fn.parallel is not None:
            var = f"i_{fn.parallel.var}"
            self.names[fn.parallel.var] = var
            extent = strip_parens(self.expr(fn.parallel.extent))
            self.emit(f"for (int64_t {var} = 0, {var}_end = {extent}; {var} < {var}_end; {var}++) {{")
            self.depth += 1
        for t in sorted(self.shapes):
            if t not in self.views and first_access(fn.body, t) == "read":
                r, c = self.shapes[t]
                self.open_loop("e", r * c)
                self.emit(f"t_{t}[e] = NAN;")
                self.close()
        self.body(fn.body)
        self.flush()
        if fn.parallel is not None:
            self.close()
        return self.lines

    def body(self, stmts) -> None:
        for s in stmts:
            if isinstance(s, ForRange):
                self.loop(s)
            else:
                self.instr(s)

    def loop(self, s: ForRange) -> None:
        var = f"i_{s.var}"
        self.names[s.var] = var
        lb, ub = strip_parens(self.expr(s.lb)), strip_parens(self.expr(s.ub))
        step = const_value(s.step)
        if isinstance(step, int) and step > 0:
            self.emit(f"for (int64_t {var} = {lb}, {var}_end = {ub}; {var} < {var}_end; {var} += {step}) {{")
            self.depth += 1
        else:  # a step only known at run time: the evaluator's trip count (none for a step of 0)
            self.emit("{")
            self.depth += 1
            self.emit(f"const int64_t {var}_lb = {lb}, {var}_st = {strip_parens(self.expr(s.step))};")
            self.emit(f"const int64_t {var}_n = pto_trips({var}_lb, {ub}, {var}_st);")
            self.emit(f"for (int64_t {var}_t = 0; {var}_t < {var}_n; {var}_t++) {{")
            self.depth += 1
            self.emit(f"const int64_t {var} = {var}_lb + {var}_st * {var}_t;")
        self.body(s.body)
        self.close()
        if not (isinstance(step, int) and step > 0):
            self.close()
        del self.names[s.var]

    def _layout(self) -> tuple[dict[str, int], int]:
        """Offsets (in floats) of the tiles, the temporary row and the pack area in scratch."""
        offsets, at = {}, 0
        for t in sorted(self.shapes):
            if t in self.fused:  # never made
                continue
            offsets[t] = at
            r, c = self.shapes[t]
            at += -(-r * c // ALIGN_FLOATS) * ALIGN_FLOATS
        for name, floats in (("tmp_", self.temp_floats), ("pack_", self.pack_floats)):
            offsets[name] = at
            at += -(-floats // ALIGN_FLOATS) * ALIGN_FLOATS
        return offsets, max(at, ALIGN_FLOATS)

    def _declarations(self, offsets: dict[str, int]) -> list[tuple[str, str]]:
        """``(name, declaration line)`` of everything the body may use, in order."""
        fn, out = self.fn, []
        for k, p in enumerate(fn.memrefs):
            const = "const " if self.access.get(p.name) is None or self.access[p.name].direction == "in" else ""
            ctype = "uint8_t" if p.dtype.is_quantized else C_TYPE[p.dtype]
            out.append((f"P_{p.name}", f"    {const}{ctype} *const P_{p.name} = ({const}{ctype} *)m[{k}].origin;"))
            out.append((f"S_{p.name}", f"    const int64_t S_{p.name} = m[{k}].ld;"))
            out.append((f"m_{p.name}_rows", f"    const int64_t m_{p.name}_rows = m[{k}].rows;"))
            out.append((f"m_{p.name}_cols", f"    const int64_t m_{p.name}_cols = m[{k}].cols;"))
            if p.dtype.is_quantized:  # (rows of blocks: the origin is a row's first byte, the column is the load's)
                out.append((f"m_{p.name}_c0", f"    const int64_t m_{p.name}_c0 = m[{k}].col0;"))
                out.append((f"nb_{p.name}", f"    const int64_t nb_{p.name} = m[{k}].tcols / {p.dtype.quant.block};"))
        for k, p in enumerate(fn.scalars):
            out.append((f"s_{p.name}", f"    const int64_t s_{p.name} = s[{k}];"))
        for t in sorted(self.shapes):
            if t in self.fused:
                continue
            r, c = self.shapes[t]
            out.append((f"t_{t}", f"    float *const t_{t} = scratch + {offsets[t]}; /* {r} x {c} {self.dtypes[t]} */"))
            if t in self.views:
                out.append((f"p_{t}", f"    const float *p_{t} = t_{t};"))
                out.append((f"ld_{t}", f"    int64_t ld_{t} = {c};"))
        for name in ("tmp_", "pack_"):
            out.append((name, f"    float *const {name} = scratch + {offsets[name]};"))
        for name, cname in self.names.items():
            if cname.startswith("l_"):
                out.append((cname, f"    int64_t {cname} = 0; /* load_scalar {name} */"))
        return out


def render_incore(variants: list[IncoreFunction], name: str) -> CIncore:
    """One C file with a kernel per variant (specialized InCore functions, in order) and the
    entry points ``pto_<name>_kernel`` and ``pto_<name>_run``."""
    kernels, bodies = [], []
    formats = {}
    for fn in variants:
        kernel, lines = KernelRenderer(fn).render()
        kernels.append(kernel)
        bodies += lines
        formats.update((p.dtype.short, p.dtype.quant) for p in fn.memrefs if p.dtype.is_quantized)
    helpers = [line for f in sorted(formats) for line in render_helpers(formats[f])]
    decl = entry_declarations(name)
    n = len(kernels)
    table = [f'    {{{k.symbol}, {k.n_mems}, {k.n_scalars}, {k.scratch_floats}, "{k.variant}"}},' for k in kernels]
    src = [
        f"/* {name}_incore.c - the InCore functions of `{name}` as C, generated by pto {__version__}.",
        " *",
        " * One kernel per function variant (the calling convention of pto_kernel_abi.h); the",
        " * arithmetic is pto_tile.h's. Do not edit: regenerate with `pto codegen`.",
        " */",
        "#include <stdlib.h>",
        "",
        '#include "pto_runtime.h"',
        '#include "pto_tile.h"',
        "",
        *helpers,
        *bodies,
        "static const pto_kernel_info kernels_[] = {",
        *(table or ["    {NULL, 0, 0, 0, \"\"},"]),
        "};",
        "",
        decl["kernel"],
        "{",
        f"    return k >= 0 && k < {n} ? &kernels_[k] : NULL;",
        "}",
        "",
        "/* n_tasks tasks of variant k, one after another: mems[t * n_mems ...], scalars[t * n_scalars ...] */",
        decl["run"],
        "{",
        "    const pto_kernel_info *info;",
        "    void *block;",
        "    float *scratch;",
        "    int64_t t;",
        "    int st = PTO_OK;",
        f"    if (k < 0 || k >= {n} || n_tasks < 0 || mems == NULL || scalars == NULL) return PTO_ERR_INVALID;",
        "    info = &kernels_[k];",
        "    block = malloc(sizeof(float) * (size_t)info->scratch_floats + 64);",
        "    if (block == NULL) return PTO_ERR_NO_MEMORY;",
        "    scratch = (float *)(((uintptr_t)block + 63) & ~(uintptr_t)63);",
        "    for (t = 0; t < n_tasks && st == PTO_OK; t++) {",
        "        st = info->fn(mems + t * info->n_mems, scalars + t * info->n_scalars, scratch);",
        "    }",
        "    free(block);",
        "    return st;",
        "}",
        "",
    ]
    return CIncore(name, "\n".join(src), tuple(kernels))


__all__ = ["CIncore", "CKernel", "KernelRenderer", "render_incore", "view_tiles", "first_access",
           "entry_declarations"]
