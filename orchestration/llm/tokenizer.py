"""Text to token ids and back (:class:`Tokenizer`), streaming detokenization
(:class:`StreamDecoder`) and the chat template, from a GGUF file or a Hugging Face folder.

Built on the maintained ``tokenizers`` library (BPE is not re-implemented here). GGUF: the
``gpt2`` tokenizer model (byte-level BPE: ``tokenizer.ggml.tokens``, ``merges``,
``token_type``, the bos/eos ids and ``add_bos_token``/``add_eos_token``), with the
pre-tokenizer (how text is split before BPE) chosen by ``tokenizer.ggml.pre`` as transformers'
GGUF loader chooses it: the GPT-2 split for SmolLM and StarCoder vocabularies (llama.cpp splits
digits one by one there first, which gives the same tokens because those vocabularies, trained
with that split, have no merge joining a digit to anything), LLaMA 3's for ``llama-bpe`` and its
aliases; other values are refused by name rather than tokenized differently from the model's
training. Control tokens (``token_type`` 3) are special tokens, user-defined ones (4) added
tokens: both match whole in the text. Hugging Face: the folder's tokenizer.json as it is, the
special tokens and template from tokenizer_config.json (and chat_template.jinja).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from pto.orchestration.llm.chat import render_chat
from pto.orchestration.model.gguf_file import GGUFFile, from_checkpoint

from pto.errors import UsageError

#: tiktoken's cl100k split, LLaMA 3's pre-tokenizer
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
#: ``tokenizer.ggml.pre`` -> the split regex before byte-level BPE (None: GPT-2's own)
PRE_TOKENIZERS = {
    None: None, "gpt-2": None, "smollm": None, "starcoder": None, "refact": None,
    "llama-bpe": _LLAMA3_SPLIT, "llama3": _LLAMA3_SPLIT, "llama-v3": _LLAMA3_SPLIT, "smaug-bpe": _LLAMA3_SPLIT,
    "dbrx": _LLAMA3_SPLIT, "falcon3": _LLAMA3_SPLIT,
}
_CONTROL, _USER_DEFINED = 3, 4  # llama.cpp's token types
_SPECIAL_NAMES = ("bos", "eos", "unk", "pad")


def _tokenizers():
    try:
        import tokenizers
    except ImportError:
        raise UsageError("tokenizing needs the `tokenizers` package (pip install 'pto[model]')") from None
    return tokenizers


class Tokenizer:
    """A model's tokenizer: :meth:`encode`, :meth:`decode`, :meth:`stream` and the chat
    template (:meth:`apply_chat_template`). ``backend``: a ``tokenizers.Tokenizer`` that adds the
    beginning-of-sequence token itself when the model wants one; ``special``: ``bos_token``,
    ``eos_token``, ... as the chat template sees them; ``where`` names the file in errors."""

    def __init__(self, backend, where: str, special: dict[str, str] | None = None,
                 chat_template: str | None = None):
        self.backend = backend
        self.where = where
        self.special = {k: v for k, v in (special or {}).items() if v is not None}
        self.chat_template = chat_template

    @property
    def vocab_size(self) -> int:
        """Token ids in use (the model's embedding may have more rows)."""
        return self.backend.get_vocab_size(with_added_tokens=True)

    def token_id(self, token: str) -> int | None:
        """The id of a token spelled as the vocabulary spells it (None: not in it)."""
        return self.backend.token_to_id(token)

    def encode(self, text: str, add_special: bool = True) -> list[int]:
        """The ids of ``text``; special tokens written in it (``<|im_start|>``) are matched whole;
        ``add_special``: with the beginning-of-sequence token when the model's tokenizer adds one."""
        return self.backend.encode(text, add_special_tokens=add_special).ids

    def decode(self, ids, skip_special: bool = False) -> str:
        """The text of ``ids`` (incomplete UTF-8 at either end as U+FFFD)."""
        return self.backend.decode([int(i) for i in ids], skip_special_tokens=skip_special)

    def stream(self, skip_special: bool = True) -> StreamDecoder:
        """A :class:`StreamDecoder` for one generated sequence."""
        return StreamDecoder(self, skip_special)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True, **variables) -> str:
        """The prompt text of a conversation under the checkpoint's chat template."""
        if not self.chat_template:
            raise UsageError(f"{self.where} has no chat template")
        return render_chat(self.chat_template, messages, self.where, add_generation_prompt,
                           **{**self.special, **variables})

    def encode_chat(self, messages: list[dict], add_generation_prompt: bool = True) -> list[int]:
        """The ids of a conversation's prompt (the template writes the special tokens itself)."""
        return self.encode(self.apply_chat_template(messages, add_generation_prompt), add_special=False)


class StreamDecoder:
    """Text of a sequence as its tokens arrive: :meth:`push` returns the text the new tokens
    complete, holding back a character whose UTF-8 bytes are split across tokens (byte-level
    BPE emits emoji and CJK a byte or two per token) until its last byte arrives; :meth:`flush`
    returns what is left. The concatenation of everything returned equals ``decode`` of all the
    ids. Each push decodes only the tokens since the last complete character, and the ones
    before them (``_prefix``), so that decoders that treat a leading space specially see it in
    context."""

    def __init__(self, tokenizer: Tokenizer, skip_special: bool = True):
        self.tokenizer = tokenizer
        self.skip_special = skip_special
        self.ids: list[int] = []
        self._prefix = 0  # window start: the tokens of the previous emitted piece
        self._read = 0  # end of the tokens whose text has been returned

    def _text(self, start: int, end: int | None = None) -> str:
        return self.tokenizer.decode(self.ids[start:end], self.skip_special)

    def push(self, ids) -> str:
        """Add one token id or a list of them; the text they complete."""
        self.ids.extend([int(ids)] if isinstance(ids, int) or getattr(ids, "ndim", 1) == 0 else map(int, ids))
        before = self._text(self._prefix, self._read)
        now = self._text(self._prefix)
        if len(now) <= len(before) or now.endswith("\ufffd"):
            return ""  # a character still waits for bytes
        self._prefix, self._read = self._read, len(self.ids)
        return now[len(before):]

    def flush(self) -> str:
        """The text still held back (an incomplete character shows as U+FFFD)."""
        out = self._text(self._prefix)[len(self._text(self._prefix, self._read)):]
        self._prefix = self._read = len(self.ids)
        return out


def load_tokenizer(path: str | os.PathLike) -> Tokenizer:
    """The tokenizer of a GGUF file or a Hugging Face model folder."""
    return from_checkpoint(path, hf_tokenizer, gguf_tokenizer)


def byte_alphabet() -> dict[int, str]:
    """Byte-level BPE's spelling of bytes as printable characters (GPT-2's): printable Latin-1
    bytes stand for themselves, the others (control, space, ...) for U+0100 on in byte order."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    out = {b: chr(b) for b in printable}
    others = [b for b in range(256) if b not in out]
    out.update({b: chr(0x100 + i) for i, b in enumerate(others)})
    return dict(sorted(out.items()))


def gguf_tokenizer(f: GGUFFile) -> Tokenizer:
    """The tokenizer in a GGUF file's ``tokenizer.*`` metadata."""
    tk = _tokenizers()
    if not f.has("tokenizer.ggml.model"):
        raise UsageError(f"{f.path} has no tokenizer (no tokenizer.ggml.model metadata)")
    kind = f.value("tokenizer.ggml.model")
    if kind != "gpt2":
        f.fail(f"tokenizer.ggml.model {kind!r} is not supported (supported: 'gpt2', byte-level BPE)")
    pre = f.value("tokenizer.ggml.pre", None)
    if pre not in PRE_TOKENIZERS:
        known = ", ".join(sorted(k for k in PRE_TOKENIZERS if k))
        f.fail(f"tokenizer.ggml.pre {pre!r} is not supported (supported: {known})")
    tokens, merges = f.value("tokenizer.ggml.tokens"), f.value("tokenizer.ggml.merges")
    types = f.value("tokenizer.ggml.token_type", [])
    spelled = byte_alphabet()
    alphabet = set(spelled.values())
    # a token outside the byte alphabet is stored as its text: spell its UTF-8 bytes
    vocab = {t if set(t) <= alphabet else "".join(spelled[b] for b in t.encode()): i for i, t in enumerate(tokens)}
    pairs = [tuple(m.split(" ")) for m in merges]
    if any(len(p) != 2 for p in pairs):
        f.fail("tokenizer.ggml.merges holds an entry that is not two tokens separated by a space")
    backend = tk.Tokenizer(tk.models.BPE(vocab=vocab, merges=pairs, fuse_unk=False))
    split = PRE_TOKENIZERS[pre]
    backend.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True) if split is None \
        else tk.pre_tokenizers.Sequence([tk.pre_tokenizers.Split(tk.Regex(split), behavior="isolated"),
                                         tk.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    backend.decoder = tk.decoders.ByteLevel()
    # control tokens spelled outside the byte alphabet are llama.cpp mislabels, not model tokens
    backend.add_special_tokens([tk.AddedToken(t, special=True, normalized=False) for t, ty in zip(tokens, types)
                                if ty == _CONTROL and set(t) <= alphabet])
    backend.add_tokens([tk.AddedToken(t, special=False, normalized=False) for t, ty in zip(tokens, types)
                        if ty == _USER_DEFINED and t in vocab])
    ids = {n: f.integer(f"tokenizer.ggml.{k}_token_id", None) for n, k in
           zip(_SPECIAL_NAMES, ("bos", "eos", "unknown", "padding"))}
    for n, i in ids.items():
        if i is not None and i >= len(tokens):
            f.fail(f"tokenizer {n} token id {i} is outside the vocabulary of {len(tokens)}")
    special = {f"{n}_token": tokens[i] for n, i in ids.items() if i is not None}
    _add_template(tk, backend, [n for n in ("bos", "eos") if f.value(f"tokenizer.ggml.add_{n}_token", False)],
                  special, ids)
    return Tokenizer(backend, str(f.path), special, f.value("tokenizer.chat_template", None))


def _add_template(tk, backend, which: list[str], special: dict[str, str], ids: dict[str, int | None]) -> None:
    """A post-processor adding ``<bos>`` before and/or ``<eos>`` after each text (``which``)."""
    which = [n for n in which if ids[n] is not None]
    if not which:
        return
    # pieces as a list, not a spaced string: a token's spelling may hold any character
    single = [*([special["bos_token"]] if "bos" in which else []), "$A",
              *([special["eos_token"]] if "eos" in which else [])]
    backend.post_processor = tk.processors.TemplateProcessing(
        single=single, pair=single + ["$B" if p == "$A" else p for p in single],
        special_tokens=[(special[f"{n}_token"], ids[n]) for n in which])


def hf_tokenizer(folder: str | os.PathLike) -> Tokenizer:
    """The tokenizer of a Hugging Face folder: tokenizer.json, with tokenizer_config.json's special
    tokens and the chat template (chat_template.jinja or tokenizer_config.json's)."""
    folder = Path(folder)
    file = folder / "tokenizer.json"
    if not file.is_file():  # (said before the package is asked for: the folder is the user's to fix)
        raise UsageError(f"{folder} has no tokenizer (no tokenizer.json)")
    tk = _tokenizers()
    try:
        backend = tk.Tokenizer.from_file(str(file))
    except Exception as e:  # tokenizers raises a bare Exception for a malformed file
        raise UsageError(f"{file}: not a tokenizers file ({str(e).splitlines()[0][:120]})") from None
    conf = {}
    if (folder / "tokenizer_config.json").is_file():
        try:
            conf = json.loads((folder / "tokenizer_config.json").read_text())
        except (OSError, ValueError) as e:
            raise UsageError(f"{folder / 'tokenizer_config.json'}: not JSON ({e})") from None
    special = {}
    for n in _SPECIAL_NAMES:
        v = conf.get(f"{n}_token")
        special[f"{n}_token"] = v.get("content") if isinstance(v, dict) else v
    template = conf.get("chat_template")
    if isinstance(template, list):  # named templates: the default one
        template = next((t.get("template") for t in template if t.get("name") == "default"), None)
    if (folder / "chat_template.jinja").is_file():
        template = (folder / "chat_template.jinja").read_text()
    return Tokenizer(backend, str(folder), special, template)


__all__ = ["Tokenizer", "StreamDecoder", "load_tokenizer", "gguf_tokenizer", "hf_tokenizer", "byte_alphabet",
           "PRE_TOKENIZERS"]
