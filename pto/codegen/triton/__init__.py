"""Triton code generation for InCore functions.

- :mod:`~pto.codegen.triton.body`: a specialized InCore function as a ``@triton.jit`` device
  function that runs one task (one parallel index) from its table row; the numerics contract.
- :mod:`~pto.codegen.triton.kernel`: the batched kernel around it (the ``waves`` executor).
- :mod:`~pto.codegen.triton.megakernel`: one persistent kernel that runs a whole task graph
  (the ``persistent`` executor).
"""

from pto.codegen.triton.body import BodyRenderer
from pto.codegen.triton.common import (
    ALIGN,
    MAX_NUMEL,
    TL_DTYPE,
    TL_PTR,
    RenderOptions,
    TableLayout,
    check_tiles,
    device_name,
    float_literal,
    kernel_name,
)
from pto.codegen.triton.kernel import AccessBound, RenderedKernel, access_bounds, launch_params, render, render_sources

__all__ = ["ALIGN", "MAX_NUMEL", "TL_DTYPE", "TL_PTR", "AccessBound", "BodyRenderer", "RenderOptions", "RenderedKernel",
           "TableLayout", "access_bounds", "check_tiles", "device_name", "float_literal", "kernel_name",
           "launch_params", "render", "render_sources"]
