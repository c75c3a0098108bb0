"""GPU runs (skipped without CUDA): the Triton backend against the torch backend and the PyTorch
reference, the 7B layer at bf16, CUDA-graph replay."""

from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.mark.parametrize("attention", ["fused", "pair", "split"])
def test_tiny_layer_triton_matches_reference(attention):
    from pto.engine import run

    res = run("llama7b", seq=333, config="tiny", device="cuda", backend="triton", dtype="bf16",
              attention=attention, check=True)
    assert res["rel_err"] <= 2e-2


def test_f32_programs_on_triton():
    from pto.engine import run

    for prog in ("softmax", "bgemm"):
        res = run(prog, seq=333, config="tiny", device="cuda", backend="triton", dtype="f32", check=True)
        assert res["rel_err"] <= 1e-4, (prog, res)


def test_7b_layer_bf16_and_graph_replay():
    from pto.engine import run

    res = run("llama7b", seq=1024, config="7b", device="cuda", backend="triton", dtype="bf16",
              attention="fused", check=True, repeat=3)
    assert res["rel_err"] <= 2e-2
    assert res["replay_mode"] == "cuda_graph" and res["replay_ms"] > 0
