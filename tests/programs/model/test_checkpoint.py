"""Whole-model weights: every tensor of the real checkpoint (Q4_1 and Q8_0 blocks dequantized,
llama.cpp's q/k row order undone) bit-equal to the tensor transformers loads from the same file;
tiny GGUF files written from a model (F32: bit-equal to the model itself, so the row order is
checked without transformers; F16 and Q8_0: bit-equal to transformers' reading), tied and untied;
Hugging Face folders (one file and sharded); and every refusal as one UsageError line naming
the file and the tensor."""

from __future__ import annotations

import pytest
import torch

from .conftest import need
from .tiny import assert_refused, tiny_model, write_gguf


@pytest.fixture(autouse=True, scope="module")
def _packages():
    need("gguf")
    need("transformers")


def _as_hf(name: str, t: torch.Tensor) -> torch.Tensor:
    """One of our tensors in transformers' layout (Linear's [out, in], norms 1-D)."""
    return t.reshape(-1) if t.shape[0] == 1 else t.t()


def _hf_name(ours: str) -> str:
    from pto.orchestration.model.checkpoint import HF_NAMES

    fixed = {"embedding": "model.embed_tokens.weight", "norm": "model.norm.weight", "lm_head": "lm_head.weight"}
    if ours in fixed:
        return fixed[ours]
    _, i, inp = ours.split(".")
    return f"model.layers.{i}.{HF_NAMES[inp]}"


def _assert_same(weights, state: dict[str, torch.Tensor]) -> int:
    """Every tensor of ``weights`` bit-equal to transformers' ``state``; how many were compared."""
    ours = weights.tensors()
    for name, t in ours.items():
        ref = state[_hf_name(name)]
        got = t if name == "embedding" else _as_hf(name, t)
        assert got.shape == ref.shape and torch.equal(got, ref), name
    return len(ours)


@pytest.mark.slow
def test_smollm_weights_equal_transformers(weights, hf_model):
    n = _assert_same(weights, hf_model.state_dict())
    assert n == 3 + 9 * 30
    assert weights.lm_head.data_ptr() == weights.embedding.data_ptr()  # tied: a view, no copy
    assert all(t.dtype == torch.float32 for t in weights.tensors().values())
    assert weights.layers[0]["wq"].shape == (576, 576) and weights.layers[0]["wk"].shape == (576, 192)
    assert weights.layers[0]["wq"].is_contiguous() and weights.layers[0]["g_attn"].shape == (1, 576)


@pytest.mark.parametrize("qtype", ["F32", "F16", "Q8_0"])
@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_tiny_gguf(tmp_path, qtype, tied):
    from pto.orchestration.model.checkpoint import load_weights
    from transformers import AutoModelForCausalLM

    model = tiny_model(tied=tied, seed=3)
    path = write_gguf(tmp_path / f"tiny-{qtype}.gguf", model, qtype)
    ours = load_weights(path, torch.float32)
    assert ours.config.tied == tied and ours.config.dtype == qtype
    if qtype == "F32":  # the file holds the model's own values: the row order round-trips
        _assert_same(ours, model.state_dict())
    ref = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file=path.name, dtype=torch.float32)
    _assert_same(ours, ref.state_dict())
    assert load_weights(path, torch.bfloat16).layers[1]["wd"].dtype == torch.bfloat16


@pytest.mark.parametrize("shards", [False, True], ids=["one-file", "sharded"])
@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_hf_folder(tmp_path, tied, shards):
    from pto.orchestration.model.checkpoint import load_weights

    model = tiny_model(tied=tied, seed=4)
    model.save_pretrained(tmp_path, max_shard_size="100KB" if shards else "5GB")
    assert (tmp_path / "model.safetensors.index.json").is_file() == shards
    ours = load_weights(tmp_path)
    _assert_same(ours, model.state_dict())
    assert (ours.lm_head.data_ptr() == ours.embedding.data_ptr()) == tied


def _refused(path, *words):
    from pto.orchestration.model.checkpoint import load_weights

    assert_refused(load_weights, path, *words)


def test_gguf_refusals(tmp_path):
    import numpy as np

    model = tiny_model()
    _refused(write_gguf(tmp_path / "a.gguf", model, drop=("blk.1.ffn_up.weight",)), "a.gguf", "blk.1.ffn_up.weight")
    wrong = np.random.default_rng(0).standard_normal((256, 100)).astype(np.float32)
    _refused(write_gguf(tmp_path / "b.gguf", model, tensors={"blk.0.ffn_gate.weight": wrong}),
             "b.gguf", "blk.0.ffn_gate.weight is 256 x 100", "256 x 128")
    odd = np.random.default_rng(1).standard_normal(128)  # float64: a type gguf cannot dequantize
    _refused(write_gguf(tmp_path / "c.gguf", model, tensors={"output_norm.weight": odd}),
             "c.gguf", "output_norm.weight", "F64")
    data = write_gguf(tmp_path / "d.gguf", model).read_bytes()
    (tmp_path / "e.gguf").write_bytes(data[: len(data) - 1000])
    # issue 43: where the file ends and what it needed, not the reader's IndexError
    _refused(tmp_path / "e.gguf", "e.gguf", f"truncated: {len(data) - 1000:,} of its {len(data):,} bytes",
             "missing from the data of tensor")
    (tmp_path / "f.gguf").write_bytes(data[:200])
    _refused(tmp_path / "f.gguf", "f.gguf", "truncated: the file ends at byte 200, in its metadata, after key")


def test_hf_refusals(tmp_path):
    model = tiny_model(tied=False)
    model.save_pretrained(tmp_path)
    from safetensors.torch import load_file, save_file

    state = load_file(tmp_path / "model.safetensors")
    save_file({k: v for k, v in state.items() if k != "lm_head.weight"}, tmp_path / "model.safetensors")
    _refused(tmp_path, "lm_head.weight", "not tied")
    state["model.norm.weight"] = torch.ones(7)
    save_file(state, tmp_path / "model.safetensors")
    _refused(tmp_path, "model.norm.weight is 7", "128")
    state.pop("model.norm.weight")
    state["model.layers.1.mlp.up_proj.weight"] = state["model.layers.1.mlp.up_proj.weight"][:, :5].contiguous()
    save_file(state, tmp_path / "model.safetensors")
    _refused(tmp_path, "model.layers.1.mlp.up_proj.weight")


def _assert_kept_header_is_the_readers(path) -> None:
    """The header a process keeps reads back as the gguf package's reader reads ``path``."""
    import gguf
    import numpy as np
    from pto.orchestration.model import gguf_file

    first = gguf_file.GGUFFile(path)  # parsed by the reader, and kept
    assert gguf_file._cached_header(path) is not None
    kept = gguf_file.GGUFFile(path)
    reader = gguf.GGUFReader(path)
    assert kept.values == {k: f.contents() for k, f in reader.fields.items()} == first.values
    assert list(kept.tensors) == [t.name for t in reader.tensors]
    for t in reader.tensors:
        mine = kept.tensors[t.name]
        assert (mine.tensor_type, mine.shape, mine.data.dtype, mine.data.shape) == (
            t.tensor_type, tuple(int(n) for n in t.shape), t.data.dtype, t.data.shape), t.name
        assert np.array_equal(mine.data.view(np.uint8), t.data.view(np.uint8)), t.name


def test_a_gguf_header_kept_between_processes_is_the_readers(tmp_path, monkeypatch):
    """The header a process keeps in the cache (the metadata's values, where each tensor's data
    lies) reads back as the gguf package's reader reads the file: every value equal, every
    tensor's type, dimensions and data bit-equal (F16 matrices, F32 norms); a file changed on
    disk, or a kept header that does not fit the file, is parsed again."""
    from pto.orchestration.model import gguf_file

    monkeypatch.setenv("PTO_CACHE_DIR", str(tmp_path / "cache"))
    tiny = write_gguf(tmp_path / "tiny.gguf", tiny_model(seed=5), "F16")
    _assert_kept_header_is_the_readers(tiny)
    header = gguf_file._header_file(tiny)
    header.write_text('{"values": {}, "tensors": [["x", 0, [4], "<f4", [4], 999999999]]}')
    assert gguf_file._cached_header(tiny) is None  # past the end of the file: parsed again
    write_gguf(tiny, tiny_model(seed=6), "F32")
    assert gguf_file._header_file(tiny) != header and gguf_file._cached_header(tiny) is None
    assert gguf_file.GGUFFile(tiny).qtype("blk.0.attn_q.weight") == "F32"


@pytest.mark.slow
def test_the_real_checkpoints_kept_header_is_the_readers(tmp_path, monkeypatch, smollm):
    """The same on SmolLM2's file (Q4_1, Q8_0 and F32 tensors, a 49,152-token vocabulary)."""
    monkeypatch.setenv("PTO_CACHE_DIR", str(tmp_path / "cache"))
    _assert_kept_header_is_the_readers(smollm)
