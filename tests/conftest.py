"""Shared pytest setup: without a CUDA GPU, Triton kernels run under the Triton interpreter.

``TRITON_INTERPRET`` must be set before anything imports triton (``triton.jit`` reads it when a
kernel is defined), so it is set here, before test modules are collected.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
