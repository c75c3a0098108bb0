"""bench/gluon_chain.py's ``pre`` and ``ll`` chains under the Triton interpreter: one layer (the
interpreter runs programs one after another, so no program may wait on a later one), the
layer's product against torch's in float64, the written flags the next layer's; the launch a
layer ways (``lpdl``, ``lll``) over three layers, launch after launch (without PDL, which the
interpreter does not run); and the "LL" words' packing of f32 bits (signs, infinities and NaNs'
payloads kept)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

_BENCH = Path(__file__).resolve().parents[2] / "bench"
_spec = importlib.util.spec_from_file_location("gluon_chain_bench", _BENCH / "gluon_chain.py")
chain = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(chain)

pytestmark = pytest.mark.interpret


def _layer(D: int, R: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    W = (torch.randn(1, D, D, generator=g) / D ** 0.5).to(torch.bfloat16)
    x = torch.randn(D, generator=g)
    # f32 sums of bf16 weights times f32 x, in another order than torch's: D roundings of 2^-24
    # relative to the sum of the magnitudes
    ref = W[0].double() @ x.double()
    tol = D * 2.0 ** -24 * float((W[0].double().abs() @ x.double().abs()).max())
    return W, x, ref, tol


@pytest.mark.parametrize("D,R,BK,NKP", [(96, 8, 32, 4), (128, 16, 32, 4), (80, 8, 16, 8)])
def test_the_ll_chain_computes_a_layer_and_flags_it_for_the_next(D, R, BK, NKP):
    W, x, ref, tol = _layer(D, R, D)
    for epoch in (1, 9):
        XW = torch.zeros(2, D, dtype=torch.int64)
        XW[0] = chain.ll_words(x, epoch * 2)
        XW[1] = chain.ll_words(torch.full((D,), float("nan")), epoch * 2 - 1)  # the last run's stale words
        chain.chain_ll[(D // R,)](W, XW, 1, epoch, D=D, R=R, BK=BK, NKP=NKP, WAIT=True, num_warps=4)
        assert torch.equal(XW[1] >> 32, torch.full((D,), epoch * 2 + 1))
        assert float((chain.ll_values(XW[1]).double() - ref).abs().max()) <= tol


@pytest.mark.parametrize("D,R,BK,NKP", [(96, 8, 32, 4), (80, 8, 16, 8)])
def test_the_pre_chain_computes_a_layer_and_releases_its_counter(D, R, BK, NKP):
    W, x, ref, tol = _layer(D, R, D + 1)
    P = D // R
    X = torch.zeros(2, D)
    X[0] = x
    C = torch.tensor([P, 0], dtype=torch.int32)
    chain.chain_pre[(P,)](W, X, C, 1, D=D, R=R, BK=BK, NKP=NKP, P=P, WAIT=True, num_warps=4)
    assert int(C[1]) == P
    assert float((X[1].double() - ref).abs().max()) <= tol


@pytest.mark.parametrize("D,R,BK,NKP", [(96, 8, 32, 4), (80, 16, 16, 8)])
def test_a_launch_a_layer_chains_the_layers_by_words_or_by_launch_order(D, R, BK, NKP):
    L, P = 3, D // R
    g = torch.Generator().manual_seed(D)
    W = (torch.randn(L, D, D, generator=g) / D ** 0.5).to(torch.bfloat16)
    x = torch.randn(D, generator=g)
    ref, bound = x.double(), x.double().abs()
    for layer in range(L):
        ref, bound = W[layer].double() @ ref, W[layer].double().abs() @ bound
    tol = L * D * 2.0 ** -24 * float(bound.max())  # each layer's f32 sums, and its rounding carried on
    X = torch.zeros(L + 1, D)
    X[0] = x
    for layer in range(L):
        chain.layer_pdl[(P,)](W, X, layer, D=D, R=R, BK=BK, NKP=NKP, WAIT=True, PDL=False, num_warps=4)
    assert float((X[L].double() - ref).abs().max()) <= tol
    epoch = 4
    XW = torch.zeros(L + 1, D, dtype=torch.int64)
    XW[0] = chain.ll_words(x, epoch * (L + 1))
    for layer in range(L):
        chain.layer_ll[(P,)](W, XW, layer, L, epoch, D=D, R=R, BK=BK, NKP=NKP, WAIT=True, PDL=False, num_warps=4)
    assert torch.equal(XW[1:] >> 32, (epoch * (L + 1) + 1 + torch.arange(L))[:, None].expand(L, D))
    assert torch.equal(chain.ll_values(XW[L]), X[L])  # the same arithmetic, bit for bit


def test_ll_words_keep_every_f32_bit_pattern():
    g = torch.Generator().manual_seed(5)
    bits = torch.randint(-2 ** 31, 2 ** 31, (4096,), generator=g, dtype=torch.int64).to(torch.int32)
    bits[:4] = torch.tensor([0x7F800000, -0x800000, 0x7FC00001, -0x80000000], dtype=torch.int32)  # +inf, -inf, NaN, -0
    values = bits.view(torch.float32)
    for flag in (0, 1, 2 ** 30):
        words = chain.ll_words(values, flag)
        assert torch.equal(words >> 32, torch.full_like(words, flag))
        assert torch.equal(chain.ll_values(words).view(torch.int32), bits)
