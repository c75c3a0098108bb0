"""Programs whose tiles or tensors have dims that are not powers of two on the Triton backend
(padded blocks, tests/codegen/test_triton_padding.py has the ops), under the Triton interpreter:

- softmax and bgemm built with odd tile widths (their named configurations have none): the wave
  and persistent executors against the torch backend and the math, the persistent bit-identical
  to the waves;
- the LLaMA layer at SmolLM2-135M's shape scaled down (hidden 192, 3 query heads and 1
  key/value head of 64, FFN 512; no padded tile, the tensors' odd widths only) and with heads of
  48 (padded Q, K, V, RoPE and accumulator tiles, Q K^T contracting a padded dim) in every
  attention mode on both executors, against the layer's reference;
- the padded kernels of the head-48 layer (the GPU's tiling) and SmolLM2-width functions with
  whole-width tiles, compiled for sm_90 in bf16.
"""

from __future__ import annotations

import os

import pytest
import torch

pytest.importorskip("triton")

from pto.orchestration.llama.config import LlamaConfig  # noqa: E402

from pto.codegen.triton.common import block_shape  # noqa: E402
from pto.engine import Runner, execute, rel_err, resolve  # noqa: E402
from pto.interp.orchestration import iter_tasks  # noqa: E402
from pto.ir.analysis import specialize  # noqa: E402
from pto.ir.dtypes import DType  # noqa: E402
from pto.ir.facts import tile_shape  # noqa: E402
from pto.machine.target import get as target  # noqa: E402
from pto.programs import get  # noqa: E402
from tests.codegen.tritonkit import compile_both_paths_sm90  # noqa: E402

pytestmark = [pytest.mark.interpret,
              pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                 reason="needs the Triton interpreter (TRITON_INTERPRET=1)"),
              # padding lanes and rows past a region compute on -inf and NaN, as they may
              pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning"),
              pytest.mark.filterwarnings("ignore:All-NaN slice encountered:RuntimeWarning")]

#: SmolLM2-135M (hidden 576, 9 query heads and 3 key/value heads of 64, FFN 1536) at a third
SMOL = LlamaConfig(hidden=192, heads=3, head_dim=64, ffn=512, kv_heads=1, eps=1e-5, theta=100000.0)
#: heads of 48: the attention and RoPE tiles padded (48 -> 64, halves of 24 -> 32)
HEAD48 = LlamaConfig(hidden=144, heads=3, head_dim=48, ffn=320, kv_heads=1)


def _padded(fn) -> list[str]:
    dims = dict(fn.variant)
    return [t.name for t in fn.tiles if block_shape(tile_shape(t, dims)) != tile_shape(t, dims)]


def _variants(module, scalars) -> dict:
    out = {}
    for t in iter_tasks(module, scalars):
        out.setdefault(t.func.variant_name, t.func)
    return out


def _both_executors(module, scalars, inputs, outputs):
    """``{executor: outputs}`` of the waves and persistent executors on the Triton backend, and
    of the torch backend (``torch``)."""
    runs = {"torch": ("torch", "waves"), "waves": ("triton", "waves"), "persistent": ("triton", "persistent")}
    out = {}
    for name, (backend, executor) in runs.items():
        res = execute(module, scalars, {k: v.clone() for k, v in inputs.items()}, device="cpu", backend=backend,
                      executor=executor)
        out[name] = {k: res[k] for k in outputs}
    return out


# softmax and bgemm at odd tile widths --------------------------------------------------------------


@pytest.mark.parametrize("cols", [100, 200])
def test_softmax_at_odd_widths(cols):
    """One chunk of the whole width: 64 x ``cols`` tiles (blocks of 128 and 256 columns) whose
    -inf padding must stay out of the row max and sum."""
    from pto.orchestration.softmax import build_module

    module = build_module(cols, DType.F32, target("x86_64"))
    assert any(_padded(f) for f in _variants(module, {"R": 70}).values())
    x = torch.randn(70, cols, generator=torch.Generator().manual_seed(cols)) * 3
    got = _both_executors(module, {"R": 70}, {"x": x}, ["y"])
    assert torch.equal(got["persistent"]["y"], got["waves"]["y"])
    torch.testing.assert_close(got["waves"]["y"], got["torch"]["y"], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got["waves"]["y"], torch.softmax(x, dim=-1), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("tiles,mnk", [((24, 40, 20), (45, 90, 70)), ((5, 12, 7), (19, 30, 22))],
                         ids=["dot", "broadcast-sum"])
def test_bgemm_at_odd_tiles(tiles, mnk):
    """24x20 @ 20x40 tiles (blocks 32x32 @ 32x64: tl.dot with a padded contraction) and 5x7 @
    7x12 (blocks below 16: the broadcast-multiply-sum), M, N and K not multiples of them."""
    from pto.orchestration.bgemm import build_module

    module = build_module(DType.F32, *tiles)
    M, N, K = mnk
    sc = {"batch": 2, "M": M, "N": N, "K": K}
    assert all(_padded(f) for f in _variants(module, sc).values())
    g = torch.Generator().manual_seed(sum(tiles))
    a, b = torch.randn(2 * M, K, generator=g), torch.randn(2 * K, N, generator=g)
    got = _both_executors(module, sc, {"A": a, "B": b}, ["C"])
    assert torch.equal(got["persistent"]["C"], got["waves"]["C"])
    torch.testing.assert_close(got["waves"]["C"], got["torch"]["C"], rtol=1e-5, atol=1e-5)
    want = torch.bmm(a.double().view(2, M, K), b.double().view(2, K, N)).view(2 * M, N).float()
    torch.testing.assert_close(got["waves"]["C"], want, rtol=1e-5, atol=1e-5)


# the LLaMA layer ---------------------------------------------------------------------------------------


def _layer(cfg: LlamaConfig, executor: str, attention: str, fuse: bool, seq: int):
    job = resolve("llama", device="cpu", backend="triton", executor=executor, config=cfg.spec(), dtype="f32",
                  options={"attention": attention, "fuse_norm_rope": fuse})
    runner = Runner(job, seq)
    try:
        inputs = job.program.inputs(job.settings, job.program.shape(seq), "cpu", seed=3)
        out = runner(inputs)["y"].clone()
    finally:
        runner.close()
    return job, inputs, out


@pytest.mark.slow
@pytest.mark.parametrize("cfg,attention,fuse", [
    (SMOL, "fused", False), (SMOL, "pair", False), (SMOL, "split", False),
    (HEAD48, "fused", False), (HEAD48, "fused", True), (HEAD48, "pair", False), (HEAD48, "split", False)],
    ids=["smol-fused", "smol-pair", "smol-split", "head48-fused", "head48-fused-norm-rope", "head48-pair",
         "head48-split"])
def test_llama_layer_on_both_executors(cfg, attention, fuse):
    seq = 40
    job, inputs, waves = _layer(cfg, "waves", attention, fuse, seq)
    padded = [v for v, f in _variants(job.program.build(job.settings), {"S": seq}).items() if _padded(f)]
    assert bool(padded) == (cfg is HEAD48), padded
    _, _, persistent = _layer(cfg, "persistent", attention, fuse, seq)
    assert torch.equal(persistent, waves)
    ref = job.program.reference(job.settings, job.program.shape(seq), inputs)["y"]
    assert rel_err(waves, ref) <= 1e-5


# sm_90 -----------------------------------------------------------------------------------------------


def _sm90_functions():
    """The padded kernels of a head-48 layer at the GPU's tiling (bf16, every attention mode) and
    functions with SmolLM2's widths as whole tiles: the norm over a 576-wide row, the kv projection
    in one 192-wide block with a K step of 96, SwiGLU blocks of 96 with a K step of 48, 48-row
    attention tiles over its 9 query heads and 3 key/value heads."""
    from pto.incore.attention import flash_fused
    from pto.incore.matmul import matmul_swiglu_tile, matmul_tile
    from pto.incore.norm import rmsnorm_tile

    prog = get("llama")
    cfg = LlamaConfig(hidden=576, heads=12, head_dim=48, ffn=1536, kv_heads=4)
    fns = {}
    for attention, fuse in (("fused", True), ("fused", False), ("pair", False), ("split", False)):
        s = prog.settings(config=cfg.spec(), dtype=DType.BF16, target=target("cuda_h100"), attention=attention,
                          fuse_norm_rope=fuse)
        fns.update({v: f for v, f in _variants(prog.build(s), {"S": 300}).items() if _padded(f)})
    bf = DType.BF16
    whole = [rmsnorm_tile(576, bf, 32, 16, 576), matmul_tile(bf, 64, 576, 192, 192, 96),
             matmul_swiglu_tile(bf, 64, 576, 1536, 96, 48), flash_fused(bf, 9, 64, 48, 48, kv_heads=3)]
    return [*fns.values(), *map(specialize, whole)]


@pytest.mark.sm90
@pytest.mark.slow
def test_padded_kernels_compile_for_sm90(tmp_path):
    """Both the masked and the mask-free path; the products of padded blocks stay on the tensor
    cores."""
    functions = _sm90_functions()
    assert all(_padded(fn) for fn in functions), [fn.variant_name for fn in functions if not _padded(fn)]
    results = compile_both_paths_sm90(functions, tmp_path)
    mm = [r for r in results if r["name"].startswith(("matmul", "flash_fused", "flash_pair", "flash_score"))]
    assert mm and all("wgmma" in r["ptx"] or "mma.sync" in r["ptx"] for r in mm)
