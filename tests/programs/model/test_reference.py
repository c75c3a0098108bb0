"""The reference model with its KV cache against transformers, in float32 on the CPU.

Real checkpoint (SmolLM2-135M, 30 layers): greedy generation of 32 tokens for four prompts of
different lengths, batched, equal to transformers' ``generate(do_sample=False)`` run on each
prompt alone; teacher-forced logits, fed in pieces through the cache, close to transformers'
forward over the whole sequence.

Tolerance: ``max |ours - theirs| / max |theirs|`` over all logits. Both compute in float32
(unit roundoff 6e-8) with the same operations in the same order but other summation orders
(our ``x @ W`` against their ``F.linear``, matrices of other shapes when fed through the cache
or batched, RoPE angles in float64 here and float32 there): dot products of up to 1536 terms
through 30 residual layers differ by a few 1e-6 of the largest logit. Measured: SmolLM2 over 51
positions 3.4e-6 fed through the cache, 1.8e-6 in one forward; the tiny models 0.8e-6 to 1.1e-6,
a batch against each prompt alone 0.8e-6. The bound, 1e-5, is three times the largest; a wrong
mask, position or cache slot moves logits by 1e-2 or more (and the smallest gap between
SmolLM2's two most likely tokens there is 0.04, so greedy choices are stable).

Tiny models (seeded random weights, Hugging Face folders written by transformers): tied and
untied, grouped-query attention, LLaMA 3 and linear RoPE scaling, and Mistral's sliding window
with a ring-buffer cache that wraps during prefill and again while decoding; caches whose
lengths are not powers of two; a batch of prompts of different lengths equal to each prompt run
alone; the sampler."""

from __future__ import annotations

import pytest
import torch

from pto.errors import UsageError

from .conftest import need
from .tiny import tiny_model

TOL = 1e-5
PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village, there lived"]


@pytest.fixture(autouse=True, scope="module")
def _packages(one_thread):
    need("transformers")


def rel(ours: torch.Tensor, ref: torch.Tensor) -> float:
    return ((ours.double() - ref.double()).abs().max() / ref.double().abs().max()).item()


@pytest.fixture(scope="module")
def model(weights):
    from pto.orchestration.model.reference import ReferenceModel

    return ReferenceModel(weights)


@pytest.mark.slow
@torch.no_grad()
def test_greedy_equals_transformers(model, tokenizer, hf_model):
    prompts = [tokenizer.encode(p) for p in PROMPTS]
    prompts.append(tokenizer.encode_chat([{"role": "user", "content": "Write a haiku about the sea."}]))
    assert len({len(p) for p in prompts}) == 4
    ours = model.generate(prompts, 32, stop_ids=())
    for p, got in zip(prompts, ours):
        # no end token, so all 32 tokens count; an explicit mask, else transformers would mask the
        # prompt's <|im_end|> as padding (this model's pad id is its end id)
        ids = torch.tensor([p])
        ref = hf_model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=32, do_sample=False,
                                eos_token_id=None, pad_token_id=2)[0, len(p):].tolist()
        assert len(ref) == 32 and got == ref, tokenizer.decode(p)


@torch.no_grad()
def test_teacher_forced_logits(model, tokenizer, hf_model):
    seq = tokenizer.encode_chat([{"role": "user", "content": "Name three colors."}])
    seq += tokenizer.encode("Red, green and blue. Those are three colors 🎨 of the rainbow.", add_special=False)
    ref = hf_model(torch.tensor([seq])).logits[0]
    cache = model.new_cache(1, len(seq) + 7)  # 7 spare: not a power of two, not the sequence's length
    first = 19
    parts = [model.logits(model.forward(cache, torch.tensor([seq[:first]])))[0]]
    parts += [model.decode_step(cache, torch.tensor([t])) for t in seq[first:]]
    ours = torch.cat(parts)
    assert int(cache.lengths[0]) == len(seq) and rel(ours, ref) < TOL
    whole = model.logits(model.forward(model.new_cache(1, len(seq)), torch.tensor([seq])))[0]
    assert rel(whole, ref) < TOL and rel(ours, whole) < TOL


TINY = {
    "llama-untied": dict(),
    "llama-tied": dict(tied=True),
    "llama3-rope": dict(rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                         "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                         "original_max_position_embeddings": 16}),
    "linear-rope": dict(rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0}),
    "mistral-window": dict(window=8),
}


def _tiny(name: str, folder):
    """(name, transformers model, our ReferenceModel from the folder transformers saved it to)."""
    from pto.orchestration.model.checkpoint import load_weights
    from pto.orchestration.model.reference import ReferenceModel

    need("transformers")
    model = tiny_model(seed=5, **TINY[name])
    model.save_pretrained(folder)
    return name, model, ReferenceModel(load_weights(folder))


@pytest.fixture(scope="module", params=list(TINY))
def tiny(request, tmp_path_factory):
    return _tiny(request.param, tmp_path_factory.mktemp(request.param))


@pytest.fixture(scope="module")
def windowed(tmp_path_factory):
    return _tiny("mistral-window", tmp_path_factory.mktemp("window"))[2]


def _tokens(n: int, seed: int, vocab: int = 300) -> list[int]:
    return torch.randint(3, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@torch.no_grad()
def test_tiny_logits_equal_transformers(tiny):
    name, hf, ours = tiny
    seq = _tokens(50, 11)
    ref = hf(torch.tensor([seq])).logits[0]
    cache = ours.new_cache(1, 50)
    assert cache.ring == (name == "mistral-window") and cache.capacity == (8 if cache.ring else 50)
    parts = [ours.logits(ours.forward(cache, torch.tensor([seq[:13]])))[0]]  # 13 > 8: the ring wraps in prefill
    parts += [ours.decode_step(cache, torch.tensor([t])) for t in seq[13:]]
    assert rel(torch.cat(parts), ref) < TOL


@torch.no_grad()
def test_batch_equals_alone(tiny):
    _, _, ours = tiny
    prompts = [_tokens(n, 20 + n) for n in (5, 17, 1, 11)]
    steps = 12
    batched = ours.generate(prompts, steps, stop_ids=())
    for p, got in zip(prompts, batched):
        assert ours.generate([p], steps, stop_ids=()) == [got]
    from pto.orchestration.model.reference import pad_prompts

    tokens, lengths = pad_prompts(prompts, pad=7)
    cache = ours.new_cache(4, 37)
    logits = [ours.prefill(cache, tokens, lengths)]
    feed = torch.tensor([s[0] for s in batched])
    logits.append(ours.decode_step(cache, feed))
    assert cache.lengths.tolist() == [6, 18, 2, 12]
    for b, p in enumerate(prompts):
        alone = ours.new_cache(1, 23)
        first = ours.prefill(alone, torch.tensor([p]))
        second = ours.decode_step(alone, feed[b:b + 1])
        # the same arithmetic in other matrix shapes: the same values up to summation order
        assert rel(logits[0][b], first[0]) < TOL and rel(logits[1][b], second[0]) < TOL


@torch.no_grad()
def test_window_ring_equals_full_cache(windowed):
    """The ring of ``window`` slots against a cache holding every position, the window applied by
    the mask alone; and the ring's slots hold the last ``window`` positions."""
    from pto.orchestration.model.reference import KVCache

    ours = windowed
    seq = _tokens(30, 12)
    ring = ours.new_cache(2, 30)
    L, B, KVH, _, D = ring.k.shape
    full = KVCache(torch.zeros(L, B, KVH, 30, D), torch.zeros(L, B, KVH, 30, D), torch.zeros(B, dtype=torch.int64), 30)
    assert ring.capacity == 8 and full.capacity == 30 and not full.ring
    prompt = torch.tensor([seq[:11], seq[1:12]])
    a, b = ours.prefill(ring, prompt, torch.tensor([11, 6])), ours.prefill(full, prompt, torch.tensor([11, 6]))
    assert rel(a, b) < 1e-6
    chunk, counts = torch.tensor([seq[11:16], seq[20:25]]), torch.tensor([5, 2])  # a second prefill piece
    a, b = ours.forward(ring, chunk, counts), ours.forward(full, chunk, counts)
    assert rel(a[0], b[0]) < 1e-6 and rel(a[1, :2], b[1, :2]) < 1e-6
    for t in range(16, 29):
        nxt = torch.tensor([seq[t], seq[t - 5]])
        a, b = ours.decode_step(ring, nxt), ours.decode_step(full, nxt)
        assert rel(a, b) < 1e-6
    assert ring.lengths.tolist() == [29, 21]
    pos = ring.slot_positions()
    assert sorted(pos[0].tolist()) == list(range(21, 29)) and all(int(p) % 8 == s for s, p in enumerate(pos[0]))
    assert sorted(pos[1].tolist()) == list(range(13, 21))
    assert torch.equal(ring.k[0, 0, :, pos[0] % 8], full.k[0, 0, :, pos[0]])  # layer 0: the same keys


def test_sampler():
    from pto.orchestration.llm.sampling import Sampler

    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(0)) * 3
    assert torch.equal(Sampler()(logits), logits.argmax(-1))
    assert torch.equal(Sampler(temperature=0.7, top_k=1)(logits), logits.argmax(-1))
    draws = [Sampler(temperature=1.0, top_k=5, seed=9)(logits) for _ in range(2)]
    assert torch.equal(draws[0], draws[1])  # seeded
    s = Sampler(temperature=1.3, top_k=5, seed=1)
    top5 = logits.topk(5, -1).indices
    picks = torch.stack([s(logits) for _ in range(200)])
    assert all(bool((top5[b] == picks[:, b, None]).any(-1).all()) for b in range(3))
    assert len(set(picks[:, 0].tolist())) > 1
    for k in (50, 10**9):  # the vocabulary's size or more: every token, the draws of no top-k (no error)
        assert torch.equal(Sampler(1.0, top_k=k).probabilities(logits), Sampler(1.0).probabilities(logits))
        assert torch.equal(Sampler(1.0, top_k=k, seed=4)(logits), Sampler(1.0, seed=4)(logits))
    p = Sampler(temperature=1.0, top_p=0.5).probabilities(logits)
    order = logits.softmax(-1).sort(-1, descending=True)
    for b in range(3):  # the nucleus: the most likely tokens until their mass reaches 0.5
        k = int((order.values[b].cumsum(0) < 0.5).sum()) + 1
        assert set(p[b].nonzero()[:, 0].tolist()) == set(order.indices[b, :k].tolist())
    for bad in (dict(temperature=-1), dict(top_k=0), dict(top_p=0.0), dict(top_p=1.5)):
        with pytest.raises(UsageError):
            Sampler(**bad)


def test_refusals(windowed, tmp_path):
    ours = _tiny("llama-untied", tmp_path)[2]
    cache = ours.new_cache(2, 10)
    with pytest.raises(UsageError, match="past the cache's 10"):
        ours.prefill(cache, torch.tensor([[5] * 11, [6] * 11]))
    with pytest.raises(UsageError, match=r"tokens must be \[2, T >= 1\]"):
        ours.prefill(cache, torch.tensor([[5, 6]]))
    with pytest.raises(UsageError, match="outside the vocabulary"):
        ours.decode_step(cache, torch.tensor([5, 300]))
    with pytest.raises(UsageError, match="exceeds the model's context of 512"):
        ours.new_cache(1, 513)
    assert windowed.new_cache(1, 513).capacity == 8  # a window: any length
    with pytest.raises(UsageError, match="at least one"):
        ours.new_cache(1, 0)
    assert cache.lengths.tolist() == [0, 0]  # a refused call changes nothing
