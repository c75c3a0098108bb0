"""The lexer of the text form: tokens with their line and column, for the parser's messages."""

from __future__ import annotations

import re
from dataclasses import dataclass

from pto.errors import ParseError

_TOKEN = re.compile(r"""
    (?P<ws>[ \t\r]+|\#[^\n]*)
  | (?P<nl>\n)
  | (?P<float>(?:\d+\.\d*|\.\d+)(?:[eE][+-]?\d+)?|\d+[eE][+-]?\d+)
  | (?P<int>\d+)
  | (?P<var>%[A-Za-z_][A-Za-z0-9_]*)
  | (?P<func>@[A-Za-z_][A-Za-z0-9_]*)
  | (?P<name>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<str>"[^"\n]*")
  | (?P<op>//|<=|>=|==|!=|[-+*%<>=(){}\[\],:.])
""", re.VERBOSE)


@dataclass
class Tok:
    kind: str
    text: str
    line: int
    col: int


def tokenize(src: str) -> list[Tok]:
    toks: list[Tok] = []
    pos, line, line_start = 0, 1, 0
    while pos < len(src):
        m = _TOKEN.match(src, pos)
        if m is None:
            raise ParseError(f"line {line}, col {pos - line_start + 1}: unexpected character {src[pos]!r}")
        kind = m.lastgroup
        text = m.group()
        if kind == "nl":
            line += 1
            line_start = m.end()
        elif kind != "ws":
            toks.append(Tok(kind, text, line, pos - line_start + 1))
        pos = m.end()
    toks.append(Tok("eof", "", line, pos - line_start + 1))
    return toks


__all__ = ["Tok", "tokenize"]
