"""Execution backends for InCore tasks: ``torch`` (the batched tile evaluator, any device) and
``triton`` (generated Triton kernels; GPU, or the CPU interpreter for tests), each registered
through the ``pto.backends`` entry points. See :mod:`pto.backends.base` for the interface and the
registry."""

from pto.backends.base import CAPABILITIES, GROUP, Backend, backend_class, capable, get_backend, names, resolve

__all__ = ["CAPABILITIES", "GROUP", "Backend", "backend_class", "capable", "get_backend", "names", "resolve"]
