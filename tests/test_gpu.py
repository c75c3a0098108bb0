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


def test_nan_constants_survive_relaunch():
    """A kernel whose tile is read before it is written (NaN poison) and whose loads pad with
    NaN launches more than once (Triton re-checks global constants at every launch)."""
    import math

    from pto import InCore, f32
    from pto.backends.triton_backend import run_incore_triton

    k = InCore("nan_paths")
    x, y = k.memref("x", f32), k.memref("y", f32)
    t, acc = k.tile("t", 16, 16, f32), k.tile("acc", 16, 16, f32)
    with k.for_range("i", 0, 2) as i:
        k.load(t, x, i * 0, 0, pad=math.nan)
        k.add(acc, acc, t)  # acc is read before any write: NaN
    k.store(y, 0, 0, acc)
    fn = k.build()
    src = torch.randn(16, 16, device="cuda")
    for _ in range(2):
        out = torch.zeros(16, 16, device="cuda")
        run_incore_triton(fn, {"x": (src, 0, 0, 8, 16), "y": (out, 0, 0, 16, 16)})
        assert torch.isnan(out).all()
