"""The text form of modules: the lexer, the parser of expressions and attributes, the parser of
functions and modules (which verifies what it parses), and the printer."""

from pto.text.expr_parser import parse_expr
from pto.text.parser import parse_module
from pto.text.printer import format_expr, format_module

__all__ = ["parse_expr", "parse_module", "format_expr", "format_module"]
