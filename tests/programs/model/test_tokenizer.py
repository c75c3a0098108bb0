"""The tokenizer against transformers' on the same file: ids of many texts (ASCII, accents,
CJK, emoji sequences, whitespace runs, code, numbers, special tokens written in the text),
decoding, the chat template (rendered text and ids), the same tokenizer saved as a Hugging Face
folder, the LLaMA 3 pre-tokenizer (the real vocabulary under ``tokenizer.ggml.pre =
llama-bpe``); streaming detokenization that never splits a character; and refusals."""

from __future__ import annotations

import unicodedata

import pytest

from pto.errors import UsageError

from .conftest import need
from .tiny import tiny_model, write_gguf

TEXTS = [
    "Hello world", "The year 2024 had 365 days.", " 123 4567 1234567890", "héllo wörld, ça va? ñ ß",
    "日本語のテキストと中文", "Ωμέγα русский العربية हिंदी", "emoji 😀👍🏽 family 👨‍👩‍👧‍👦 flag 🏳️‍🌈",
    "def f(x):\n    return x**2  # square\n\n\n", "\t\ttabs\r\nCRLF\n", "   leading and trailing   ",
    "I'm can't they'll WE'RE I'D", "a1b2c3 3.14159 -1e-10 0x1F ¹²³ ½", "x = {'a': [1, 2], \"b\": None}",
    "https://example.com/path?q=1&r=2#frag", "\u00a0nbsp\u2009thin\u200bzero-width", "\x00\x01\x7f control",
    "<|im_start|>user\nhi<|im_end|>\n<|endoftext|>", "<|im_start|> spaced <|im_end|>x", "$hello _foo @bar !!!\n\n",
    "", " ", "\n", "                                                                 ",
]
CONVERSATIONS = [
    [{"role": "user", "content": "What is 2+2?"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi 😀"},
     {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "日本語で？"}],
]


@pytest.fixture(autouse=True, scope="module")
def _packages():
    need("gguf")
    need("tokenizers")
    need("transformers")


def _ids(encoded) -> list[int]:
    return encoded if isinstance(encoded, list) else list(encoded["input_ids"])


def _assert_same(ours, ref, texts=TEXTS) -> None:
    for text in texts:
        ids = ref.encode(text)
        assert ours.encode(text) == ids, text
        assert ours.decode(ids) == ref.decode(ids), text
        assert ours.decode(ids, skip_special=True) == ref.decode(ids, skip_special_tokens=True), text


def test_encode_decode_equal_transformers(tokenizer, hf_tokenizer):
    _assert_same(tokenizer, hf_tokenizer)
    assert tokenizer.encode("<|im_start|>") == [1] and tokenizer.vocab_size == 49152
    # llama.cpp splits digits one by one before BPE for this vocabulary (`smollm`), transformers
    # does not: the same tokens, because no token's text joins a numeric character to anything
    texts = tokenizer.backend.decode_batch([[i] for i in range(tokenizer.vocab_size)], skip_special_tokens=False)
    assert not [t for t in texts if len(t) > 1 and any(unicodedata.category(c)[0] == "N" for c in t)]


@pytest.mark.parametrize("generation_prompt", [True, False])
def test_chat_template_equals_transformers(tokenizer, hf_tokenizer, generation_prompt):
    for messages in CONVERSATIONS:
        text = hf_tokenizer.apply_chat_template(messages, add_generation_prompt=generation_prompt, tokenize=False)
        assert tokenizer.apply_chat_template(messages, generation_prompt) == text
        ids = _ids(hf_tokenizer.apply_chat_template(messages, add_generation_prompt=generation_prompt))
        assert tokenizer.encode_chat(messages, generation_prompt) == ids
    assert tokenizer.apply_chat_template(CONVERSATIONS[0]).endswith("<|im_start|>assistant\n")


def test_stream_never_splits_a_character(tokenizer):
    text = "".join(TEXTS[4:8])
    ids = tokenizer.encode(text)
    stream = tokenizer.stream(skip_special=False)
    pieces = [stream.push(i) for i in ids] + [stream.flush()]
    assert "".join(pieces) == tokenizer.decode(ids) == text
    assert not any("\ufffd" in p for p in pieces)
    assert sum(1 for p in pieces if not p) > 5  # emoji and CJK bytes arrive over several tokens
    stream = tokenizer.stream()
    assert stream.push(ids[:7]) + stream.push(ids[7:]) + stream.flush() == text


def test_hf_folder_tokenizer(tmp_path, tokenizer, hf_tokenizer):
    from pto.orchestration.llm.tokenizer import load_tokenizer

    hf_tokenizer.save_pretrained(tmp_path)
    ours = load_tokenizer(tmp_path)
    _assert_same(ours, hf_tokenizer)
    for messages in CONVERSATIONS:
        assert ours.apply_chat_template(messages) == tokenizer.apply_chat_template(messages)
    assert ours.special["eos_token"] == "<|im_end|>"


@pytest.mark.slow
def test_llama3_pre_tokenizer(tmp_path, smollm):
    """The LLaMA 3 split (``llama-bpe``) on the real vocabulary, against transformers' reading of
    the same metadata."""
    from pto.orchestration.llm.tokenizer import load_tokenizer
    from pto.orchestration.model.gguf_file import open_gguf
    from transformers import AutoTokenizer

    src = open_gguf(smollm)

    def tokenizer_keys(w):
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("llama-bpe")
        w.add_token_list(src.value("tokenizer.ggml.tokens"))
        w.add_token_merges(src.value("tokenizer.ggml.merges"))
        w.add_token_types(src.value("tokenizer.ggml.token_type"))

    path = write_gguf(tmp_path / "l3.gguf", tiny_model(), keys=tokenizer_keys)
    ref = AutoTokenizer.from_pretrained(tmp_path, gguf_file=path.name)
    ours = load_tokenizer(path)
    _assert_same(ours, ref, TEXTS + ["I'M DON'T 1234567 !!!\n\n\r\n  x"])
    pieces = [p for p, _ in ours.backend.pre_tokenizer.pre_tokenize_str(" 1234567 I'M")]
    assert pieces == ["Ġ", "123", "456", "7", "ĠI", "'M"]  # digits in threes, contractions of any case


def test_refusals(tmp_path, tokenizer):
    from pto.orchestration.llm.tokenizer import load_tokenizer

    path = write_gguf(tmp_path / "bare.gguf", tiny_model())
    with pytest.raises(UsageError, match=r"bare.gguf has no tokenizer"):
        load_tokenizer(path)
    with pytest.raises(UsageError, match=r"has no tokenizer \(no tokenizer.json\)"):
        load_tokenizer(tmp_path)

    def keys(w):
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("qwen99")
        w.add_token_list(["a", "b"])
        w.add_token_merges(["a b"])

    with pytest.raises(UsageError, match=r"odd.gguf: tokenizer.ggml.pre 'qwen99' is not supported"):
        load_tokenizer(write_gguf(tmp_path / "odd.gguf", tiny_model(), keys=keys))
    with pytest.raises(UsageError, match="chat messages must be"):
        tokenizer.apply_chat_template([{"content": "no role"}])
