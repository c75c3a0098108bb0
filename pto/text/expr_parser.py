"""The expression half of the text form's parser (:mod:`pto.text.parser`): token helpers,
scalar expressions with their precedence, attribute blocks. ``parse_expr`` reads one expression
for the builders (bare names allowed)."""

from __future__ import annotations

import math

from pto.errors import BuildError, ParseError
from pto.ir.expr import FUNCS, Attr, Const, Expr, Var, binop, fn
from pto.ir.names import EXPR_WORDS
from pto.text.lexer import Tok, tokenize


class ExprParser:
    """Tokens, expressions and attribute blocks: what every part of the text form shares."""

    def __init__(self, src: str, bare_names: bool = False):
        self.toks = tokenize(src)
        self.i = 0
        self.bare = bare_names

    # token helpers -----------------------------------------------------------------------------
    @property
    def tok(self) -> Tok:
        return self.toks[self.i]

    def fail(self, expected: str):
        t = self.tok
        found = "end of input" if t.kind == "eof" else f"`{t.text}`"
        raise ParseError(f"line {t.line}, col {t.col}: expected {expected}, found {found}")

    def at(self, text: str) -> bool:
        t = self.tok
        return t.text == text and t.kind in ("op", "name")

    def accept(self, text: str) -> bool:
        if self.at(text):
            self.i += 1
            return True
        return False

    def expect(self, text: str) -> Tok:
        if not self.at(text):
            self.fail(f"`{text}`")
        t = self.tok
        self.i += 1
        return t

    def take(self, kind: str, what: str) -> Tok:
        if self.tok.kind != kind:
            self.fail(what)
        t = self.tok
        self.i += 1
        return t

    def var(self) -> str:
        return self.take("var", "a %name").text[1:]

    def name(self) -> str:
        return self.take("name", "a name").text

    def int_(self) -> int:
        neg = self.accept("-")
        v = int(self.take("int", "an integer").text)
        return -v if neg else v

    def loc(self) -> str | None:
        if self.tok.kind == "name" and self.tok.text == "loc":
            self.i += 1
            return self.take("str", 'a "file:line" string').text[1:-1]
        return None

    # expressions -------------------------------------------------------------------------------
    def expr(self) -> Expr:
        return self._or()

    def _or(self):
        e = self._and()
        while self.at("or"):
            self.i += 1
            e = binop("or", e, self._and())
        return e

    def _and(self):
        e = self._cmp()
        while self.at("and"):
            self.i += 1
            e = binop("and", e, self._cmp())
        return e

    def _cmp(self):
        e = self._add()
        while self.tok.kind == "op" and self.tok.text in ("<", "<=", ">", ">=", "==", "!="):
            op = self.tok.text
            self.i += 1
            e = binop(op, e, self._add())
        return e

    def _add(self):
        e = self._mul()
        while self.tok.kind == "op" and self.tok.text in ("+", "-"):
            op = self.tok.text
            self.i += 1
            e = binop(op, e, self._mul())
        return e

    def _mul(self):
        e = self._unary()
        while self.tok.kind == "op" and self.tok.text in ("*", "//", "%"):
            op = self.tok.text
            self.i += 1
            e = binop(op, e, self._unary())
        return e

    def _unary(self):
        if self.accept("-"):
            inner = self._unary()
            if isinstance(inner, Const):
                return Const(-inner.value)
            return binop("-", Const(0), inner)
        return self._primary()

    def _primary(self):
        t = self.tok
        if t.kind == "int":
            self.i += 1
            return Const(int(t.text))
        if t.kind == "float":
            self.i += 1
            return Const(float(t.text))
        if t.kind == "var":
            self.i += 1
            return self._maybe_attr(t.text[1:])
        if t.kind == "name":
            if t.text in ("min", "max"):
                self.i += 1
                self.expect("(")
                a = self.expr()
                self.expect(",")
                b = self.expr()
                out = binop(t.text, a, b)
                while self.accept(","):
                    out = binop(t.text, out, self.expr())
                self.expect(")")
                return out
            if t.text in FUNCS and self.toks[self.i + 1].text == "(":
                self.i += 2
                args = [self.expr()]
                while self.accept(","):
                    args.append(self.expr())
                self.expect(")")
                try:
                    return fn(t.text, *args)
                except BuildError as err:
                    raise ParseError(f"line {t.line}, col {t.col}: {err}") from None
            if t.text == "inf":
                self.i += 1
                return Const(math.inf)
            if t.text in ("true", "false"):
                self.i += 1
                return Const(int(t.text == "true"))
            if self.bare and t.text not in EXPR_WORDS:
                self.i += 1
                return self._maybe_attr(t.text)
        if self.accept("("):
            e = self.expr()
            self.expect(")")
            return e
        self.fail("an expression")

    def _maybe_attr(self, base: str) -> Expr:
        if self.at("."):
            self.i += 1
            field = self.name()
            if field not in ("rows", "cols"):
                raise ParseError(f"line {self.tok.line}: `{base}.{field}`: only .rows and .cols exist")
            return Attr(base, field)
        return Var(base)

    # attributes --------------------------------------------------------------------------------
    def attrs(self) -> list[tuple[str, object]]:
        items: list[tuple[str, object]] = []
        if not self.at("{") or not self._attr_block_ahead():
            return items
        self.expect("{")
        while not self.accept("}"):
            k = self.name()
            self.expect("=")
            items.append((k, self.attr_value()))
            if not self.accept(","):
                self.expect("}")
                break
        return items

    def _attr_block_ahead(self) -> bool:
        # `{ name =` starts an attribute block; `{` followed by a statement starts a body
        nxt, nxt2 = self.toks[self.i + 1], self.toks[min(self.i + 2, len(self.toks) - 1)]
        return nxt.kind == "name" and nxt2.text == "="

    def attr_value(self):
        t = self.tok
        if t.kind == "name" and t.text in ("true", "false"):
            self.i += 1
            return t.text == "true"
        if t.kind == "name" and t.text not in ("inf",):
            self.i += 1
            return t.text
        if self.accept("{"):
            levels = []
            while not self.accept("}"):
                k = self.int_()
                self.expect(":")
                v = self.int_()
                levels.append((k, v))
                if not self.accept(","):
                    self.expect("}")
                    break
            return tuple(sorted(levels))
        e = self.expr()
        if not isinstance(e, Const):
            self.fail("a constant attribute value")
        return e.value

    # InCore ------------------------------------------------------------------------------------


def parse_expr(src: str) -> Expr:
    """Parse one expression; bare identifiers are variables (``"tile_i * 32"``)."""
    p = ExprParser(src, bare_names=True)
    e = p.expr()
    if p.tok.kind != "eof":
        p.fail("end of expression")
    return e
