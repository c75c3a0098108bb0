"""The Triton backend: everything that launches generated Triton kernels.

- :mod:`.backend`: :class:`TritonBackend`, the batched kernels (a launch or two per task batch);
- :mod:`.launch`: the typed launch configuration (:class:`LaunchConfig`), the one rule that
  merges configurations (:func:`merged`), launches fitted to the device's shared memory and
  Triton's errors as one line;
- :mod:`.schedules`: the schedule database (launch settings per device, function and shape);
- :mod:`.megakernel`: a graph's plan compiled into the persistent megakernel;
- :mod:`.loader` and :mod:`.tables`: kernel sources on disk, the per-task tables;
- :mod:`.ahead`: a first run's kernels compiled on worker threads.

The kernels' source comes from :mod:`pto.codegen.triton`.
"""

from pto.backends.triton.backend import TritonBackend, pdl_mode, tma_mode
from pto.backends.triton.launch import LaunchConfig, merged, triton_error
from pto.backends.triton.loader import cache_dir, load_kernel
from pto.backends.triton.megakernel import MAX_POLLS, Megakernel, MegakernelSettings
from pto.backends.triton.tables import build_table, even_masks

__all__ = ["TritonBackend", "pdl_mode", "tma_mode", "LaunchConfig", "merged", "triton_error",
           "cache_dir", "load_kernel", "Megakernel", "MegakernelSettings", "MAX_POLLS", "build_table", "even_masks"]
