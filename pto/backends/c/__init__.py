"""The ``c`` backend: InCore functions compiled to C and run on the CPU (:mod:`.backend`), built
by :mod:`.build`; the native executor (:mod:`pto.exec.native`) runs whole graphs with it."""

from pto.backends.c.backend import CBackend

__all__ = ["CBackend"]
