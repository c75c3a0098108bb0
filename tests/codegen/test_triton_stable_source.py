"""The Triton renderer's source does not depend on the process: a kernel's text (the pto cache's
key, and Triton's) must be the same in every process that renders the same function, or each
process compiles its own. Checked across string-hash seeds (``PYTHONHASHSEED``), which reorder
every set of names: the decode step's kernels of SmolLM2 (bf16, Q4_1) and of the 8B model (Q5_K,
Q6_K and fp8 weights, whose formats have several element planes or a header), at one and eight
sequences, under every way the GEMVs read quantized weights."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("triton")

_RENDER = """
import hashlib
from dataclasses import fields
from pto.orchestration.model.decode import functions
from pto.orchestration.model.program import CONFIGS, tiling_for
from pto.orchestration.model.quantized import WeightTypes, for_weights
from pto.codegen.triton import render
from pto.codegen.triton.common import RenderOptions
from pto.ir.analysis import specialize
from pto.ir.dtypes import DType, dtype_of
from pto.machine.target import get

h = hashlib.sha256()
for name, q in (("smollm2-135m", None), ("smollm2-135m", "q4_1"), ("llama3-8b", "q5_k"), ("llama3-8b", "q6_k"),
                ("llama3-8b", "fp8")):
    kinds = {} if q is None else {k: dtype_of(q) for k in ("w_qkv", "wo", "wg", "wu", "wd", "lm_head")}
    wt = WeightTypes(tuple(sorted(kinds.items())))
    for batch in (1, 8):
        cfg = CONFIGS[name]
        fns = functions(cfg, DType.BF16, get("cuda_h100"), for_weights(tiling_for(cfg), wt, batch), batch, wtypes=wt)
        for f in fields(fns):
            fn = getattr(fns, f.name)
            for mode in ("units", "groups", "int8", "auto") if fn is not None else ():
                h.update(render(specialize(fn), RenderOptions(qgemv=mode, asm=True)).source.encode())
print(h.hexdigest())
"""


def test_the_decode_steps_kernels_are_the_same_text_in_every_process():
    digests = set()
    for seed in (1, 2, 3, 4):
        env = {**os.environ, "PYTHONHASHSEED": str(seed)}
        env.pop("TRITON_INTERPRET", None)
        run = subprocess.run([sys.executable, "-c", _RENDER], capture_output=True, text=True, env=env, check=True)
        digests.add(run.stdout.strip())
    assert len(digests) == 1, digests
