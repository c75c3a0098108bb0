"""The text form of modules: printer and parser."""

from pto.text.expr_parser import parse_expr
from pto.text.parser import parse_module
from pto.text.printer import format_expr, format_module

__all__ = ["parse_expr", "parse_module", "format_expr", "format_module"]
