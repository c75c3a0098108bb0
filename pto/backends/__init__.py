"""Execution backends for InCore tasks: ``torch`` (the batched tile evaluator, any device) and
``triton`` (generated Triton kernels; GPU, or the CPU interpreter for tests). See
:mod:`pto.backends.base` for the interface and the registry."""

from pto.backends.base import BACKENDS, CAPABILITIES, Backend, capable, get_backend, names, resolve

__all__ = ["BACKENDS", "CAPABILITIES", "Backend", "capable", "get_backend", "names", "resolve"]
