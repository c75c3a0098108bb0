"""Parse the text form (see :mod:`pto.text.printer`) back into a Module, and expression text
(``"tile_i * 32"``, bare names allowed) into an Expr for the builders. A parsed module is
verified by the same rules as a built one (:func:`pto.ir.verify.verify_module`).

A small hand-written lexer and recursive-descent parser; errors say the line, the column and
what was expected (``ParseError: line 4, col 12: expected `]`, found `,```).
"""

from __future__ import annotations

from pto.errors import BuildError, ParseError
from pto.ir.dtypes import dtype_of
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
    Parallel,
    RegionBinding,
    ScalarParam,
    TensorDecl,
    Tile,
)
from pto.ir.ops import ATTRS, BY_NAME, SIGNATURE, STORES, Op
from pto.ir.verify import verify_module
from pto.text.expr_parser import ExprParser


class Parser(ExprParser):
    """Functions and modules, on top of the expressions."""

    def incore(self) -> IncoreFunction:
        self.expect("incore")
        name = self.take("func", "@name").text[1:]
        dims = self._dim_list("dims")
        variant = self._dim_list("variant")
        loc = self.loc()
        self.expect("{")
        params, tiles, parallel = [], [], None
        while True:
            if self.accept("param"):
                pname = self.var()
                self.expect(":")
                if self.accept("scalar"):
                    params.append(ScalarParam(pname))
                else:
                    self.expect("memref")
                    dt = self._dtype()
                    shape = self._shape() if self.at("[") else None
                    params.append(MemRefParam(pname, dt, shape))
            elif self.accept("tile"):
                tname = self.var()
                self.expect(":")
                r, c = self._shape()
                tiles.append(Tile(tname, r, c, self._dtype()))
            elif self.accept("parallel"):
                pv = self.var()
                self.expect("<")
                parallel = Parallel(pv, self.expr())
            else:
                break
        body = self._incore_body()
        return IncoreFunction(name, tuple(params), tuple(dims), tuple(tiles), tuple(body), parallel,
                              tuple(variant), loc)

    def _dim_list(self, kw: str) -> list[tuple[str, int]]:
        out = []
        if self.accept(kw):
            self.expect("(")
            while not self.accept(")"):
                k = self.var()
                self.expect("=")
                out.append((k, self.int_()))
                if not self.accept(","):
                    self.expect(")")
                    break
        return out

    def _shape(self):
        """``[row, col]``: a shape or an index."""
        self.expect("[")
        r = self.expr()
        self.expect(",")
        c = self.expr()
        self.expect("]")
        return r, c

    def _dtype(self):
        t = self.take("name", "a dtype (f32, f16, bf16)")
        try:
            return dtype_of(t.text)
        except BuildError:
            raise ParseError(f"line {t.line}, col {t.col}: unknown dtype `{t.text}`") from None

    def _incore_body(self) -> list:
        out = []
        while not self.accept("}"):
            if self.accept("for"):
                v = self.var()
                self.expect("=")
                lb = self.expr()
                self.expect("to")
                ub = self.expr()
                self.expect("step")
                st = self.expr()
                self.expect("{")
                out.append(ForRange(v, lb, ub, st, tuple(self._incore_body())))
            else:
                out.append(self.instr())
        return out

    def instr(self) -> Instr:
        t = self.take("name", "an instruction")
        op = BY_NAME.get(t.text)
        if op is None:
            raise ParseError(f"line {t.line}, col {t.col}: unknown instruction `{t.text}`")
        if op in (Op.LOAD, Op.LOAD_SCALAR):
            dst = self.var()
            self.expect(",")
            mem = self.var()
            row, col = self._shape()
            srcs = (mem, row, col)
        elif op in STORES:
            dst = None
            mem = self.var()
            row, col = self._shape()
            self.expect(",")
            srcs = (self.var(), mem, row, col)
        else:
            dst = self.var()
            srcs = []
            for k in SIGNATURE[op][0]:
                self.expect(",")
                srcs.append(self.var() if k in "TM" else self.expr())
            srcs = tuple(srcs)
        attrs = self.attrs()
        for k, _ in attrs:
            if k not in ATTRS[op]:
                raise ParseError(f"line {t.line}: `{op.value}` has no attribute `{k}`")
        return Instr(op, dst, srcs, tuple(sorted(attrs)), loc=self.loc())

    # orchestration -----------------------------------------------------------------------------
    def orch(self) -> OrchFunction:
        self.expect("orchestration")
        name = self.take("func", "@name").text[1:]
        loc = self.loc()
        self.expect("{")
        scalars, tensors = [], []
        while True:
            if self.accept("scalar"):
                scalars.append(self.var())
            elif self.accept("tensor"):
                tname = self.var()
                self.expect(":")
                r, c = self._shape()
                dt = self._dtype()
                tensors.append(TensorDecl(tname, r, c, dt, self.name()))  # the verifier checks the role
            else:
                break
        body = self._orch_body()
        return OrchFunction(name, tuple(scalars), tuple(tensors), tuple(body), loc)

    def _orch_body(self) -> list:
        out = []
        while not self.accept("}"):
            if self.accept("let"):
                v = self.var()
                self.expect("=")
                out.append(Let(v, self.expr()))
            elif self.accept("for"):
                v = self.var()
                self.expect("=")
                lb = self.expr()
                self.expect("to")
                ub = self.expr()
                self.expect("step")
                st = self.expr()
                line = self.tok.line
                attrs = dict(self.attrs())
                reassociate = attrs.get("reassociate", False)
                if not isinstance(reassociate, bool) or (reassociate and "tile_levels" not in attrs):
                    raise ParseError(f"line {line}: loop `%{v}`: reassociate must be true or false and "
                                     "needs tile_levels")
                self.expect("{")
                body = tuple(self._orch_body())
                out.append(Loop(v, lb, ub, st, body, attrs.get("max_range"), attrs.get("min_range"),
                                attrs.get("tile_levels"), reassociate))
            elif self.accept("if"):
                cond = self.expr()
                self.expect("{")
                then = tuple(self._orch_body())
                orelse = ()
                if self.accept("else"):
                    self.expect("{")
                    orelse = tuple(self._orch_body())
                out.append(If(cond, then, orelse))
            elif self.accept("call"):
                out.append(self._call())
            else:
                self.fail("a statement (let, for, if, call) or `}`")
        return out

    def _call(self) -> Call:
        func = self.take("func", "@function").text[1:]
        self.expect("(")
        args = []
        while not self.accept(")"):
            k = self.name()
            self.expect("=")
            if self.tok.kind == "var" and self.toks[self.i + 1].text == "[":
                tname = self.var()
                self.expect("[")
                parts = [self.expr()]
                while self.accept(","):
                    parts.append(self.expr())
                self.expect("]")
                if len(parts) not in (2, 4):
                    raise ParseError(f"line {self.tok.line}: a region takes 2 or 4 expressions")
                rows, cols = (parts[2], parts[3]) if len(parts) == 4 else (None, None)
                args.append((k, RegionBinding(tname, parts[0], parts[1], rows, cols)))
            else:
                args.append((k, self.expr()))
            if not self.accept(","):
                self.expect(")")
                break
        dims = []
        if self.accept("dims"):
            self.expect("(")
            while not self.accept(")"):
                k = self.name()
                self.expect("=")
                dims.append((k, self.expr()))
                if not self.accept(","):
                    self.expect(")")
                    break
        return Call(func, tuple(args), tuple(dims), loc=self.loc())

    # module ------------------------------------------------------------------------------------
    def module(self) -> Module:
        funcs = []
        while True:
            if self.at("incore"):
                funcs.append(self.incore())
            elif self.at("orchestration"):
                funcs.append(self.orch())
            else:
                break
        self.expect("entry")
        entry = self.take("func", "@entry").text[1:]
        if self.tok.kind != "eof":
            self.fail("end of input")
        return Module(tuple(funcs), entry)


def parse_module(src: str, verify: bool = True) -> Module:
    """Parse a module's text form and verify it (:func:`pto.ir.verify.verify_module`): text
    that is not the grammar raises ParseError (with the line and column), a module that is not
    a valid program BuildError. ``verify=False`` returns what was parsed unchecked."""
    m = Parser(src).module()
    if verify:
        verify_module(m)
    return m
