"""Reading a rendered megakernel's source in tests: a device function's text, and the device
function each branch of the dispatch calls."""

from __future__ import annotations

import re


def device_function(source: str, name: str) -> str:
    """The source of the device function ``name`` (up to the next top-level definition)."""
    m = re.search(rf"^def {re.escape(name)}\(.*?(?=^@triton\.jit|\Z)", source, re.S | re.M)
    assert m, name
    return m.group(0)


def called(source: str, branch: int) -> str:
    """The name of the device function branch ``branch`` of the dispatch calls."""
    m = re.search(rf"branch == {branch}:\n(?:[^\n]*\n)*?\s+ok, t0 = (\w+)\(", source)
    assert m, branch
    return m.group(1)
