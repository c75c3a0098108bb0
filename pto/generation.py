"""What ``pto generate`` asks and what answers it.

:class:`GenerateRequest` is the command's every flag, each declared once, here: its field (name,
type, default) and its flag (the help, the metavar, the choices) in the field's metadata; the
parser adds the flags from the fields (:func:`flags`) and the command makes the request from the
parsed values (:meth:`GenerateRequest.of`), so the driver receives what the user typed, typed.

A :class:`TextGenerator` answers it: an application found, like programs, through the entry
points of the ``pto.generators`` group (:mod:`pto.plugins`; pto's own is ``llm``, the
generation application of pto.orchestration.llm): the command line never names one.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Protocol, TextIO, runtime_checkable

from pto import plugins
from pto.errors import UsageError

GROUP = "pto.generators"


@dataclass(frozen=True)
class Flag:
    """How a request's field is spelled on the command line: ``--name`` from the field's name
    (or ``name``); ``kind``: the parser's converter (``positive``, ``int``, ``float``, ``text``,
    ``switch``: a flag without a value, ``repeat``: the flag given once per value, ``executor``:
    one of the executors); ``group``: flags of one group exclude each other. ``%(default)s`` in
    ``help`` is the field's default."""

    help: str
    kind: str = "text"
    metavar: str | None = None
    choices: tuple[str, ...] | None = None
    name: str | None = None
    group: str | None = None


def _flag(default, help: str, **kw):
    return field(default=default, metadata={"flag": Flag(help, **kw)})


@dataclass(frozen=True)
class GenerateRequest:
    """What ``pto generate`` was asked (the module docstring): the model (``gguf`` or ``hf``),
    the prompts (``batch`` copies of one, or ``batch`` of them), how many tokens, where, how
    sampled, over how many tensor-parallel ranks."""

    gguf: str | None = _flag(None, "a GGUF checkpoint (its quantized weights run as the file stores them; "
                             "--dequantize for floats)", metavar="FILE", group="model")
    hf: str | None = _flag(None, "a Hugging Face folder: config.json, safetensors, tokenizer.json", metavar="DIR",
                           group="model")
    prompts: tuple[str, ...] = _flag((), "a prompt (repeat for a batch)", kind="repeat", metavar="TEXT",
                                     name="prompt")
    chat: bool = _flag(False, "wrap each prompt in the checkpoint's chat template", kind="switch")
    max_new_tokens: int = _flag(64, "tokens to generate (default: %(default)s)", kind="positive", metavar="N")
    batch: int = _flag(1, "sequences decoded together: B copies of one --prompt, or B prompts (default: %(default)s)",
                       kind="positive", metavar="B")
    device: str = _flag("auto", "where it runs (default: %(default)s)", choices=("auto", "cpu", "cuda"))
    dtype: str = _flag("auto", "the weights' and activations' dtype (default: %(default)s, bf16 on cuda, f32 on cpu)",
                       choices=("auto", "f32", "bf16", "f16"))
    executor: str = _flag("auto", "how each step's graph runs (default: %(default)s)", kind="executor")
    dequantize: bool = _flag(False, "dequantize a GGUF file's quantized weights at load (to --dtype) instead of "
                             "running them so", kind="switch")
    quantize: str | None = _flag(None, "quantize the layers' matrices and the LM head at load (pto's quantizers; the "
                                 "embedding as it is); a GGUF file's weights are dequantized first",
                                 choices=("fp8", "q8_0", "q4_0"))
    temperature: float = _flag(0.0, "0: greedy (the default); above 0: sample from softmax(logits / T)",
                               kind="float", metavar="T")
    top_k: int | None = _flag(None, "sample among the K most likely tokens (K at or above the vocabulary's size: "
                              "among all, as without it)", kind="positive", metavar="K")
    top_p: float | None = _flag(None, "sample among the fewest tokens whose probability reaches P (nucleus)",
                                kind="float", metavar="P")
    seed: int = _flag(0, "the sampling generator's seed (default: %(default)s)", kind="int")
    tp: int = _flag(1, "tensor-parallel ranks, one process each: torchrun --nproc-per-node N (default: %(default)s)",
                    kind="positive", metavar="N")
    allreduce_dtype: str | None = _flag(None, "with --tp N: the dtype the ranks' partial sums are summed in "
                                        "(default: storage)", choices=("storage", "f32"))

    @classmethod
    def of(cls, values: Any) -> GenerateRequest:
        """The request of parsed command-line values (an object with an attribute per field)."""
        kw = {f.name: getattr(values, f.name) for f in fields(cls)}
        kw["prompts"] = tuple(kw["prompts"] or ())
        return cls(**kw)

    @property
    def path(self) -> str:
        """The model's file or folder (``--gguf`` or ``--hf``)."""
        path = self.gguf or self.hf
        if path is None:
            raise UsageError("pto generate needs --gguf FILE or --hf DIR (the model)")
        return path

    @property
    def sequences(self) -> tuple[str, ...]:
        """One prompt per sequence: ``batch`` copies of a single prompt, or the prompts (as many
        as ``batch`` when it is given)."""
        if self.batch > 1 and len(self.prompts) == 1:
            return self.prompts * self.batch
        if self.batch > 1 and len(self.prompts) != self.batch:
            raise UsageError(f"--batch {self.batch} with {len(self.prompts)} prompts: give one prompt (copied) or "
                             f"{self.batch}")
        return self.prompts


def flags() -> list[tuple[str, Flag, Any]]:
    """``(field name, its Flag, its default)`` of every field, in the command's order."""
    return [(f.name, f.metadata["flag"], f.default) for f in fields(GenerateRequest)]


@runtime_checkable
class TextGenerator(Protocol):
    """What answers ``pto generate`` (registered in the ``pto.generators`` group)."""

    def generate(self, request: GenerateRequest, stream: TextIO | None = None) -> dict:
        """Text for ``request``, the first sequence's streamed to ``stream`` as it is made; the
        JSON-able result (``texts``, ``tokens``, the timings: ``pto generate --json``)."""

    def describe(self, result: dict) -> str:
        """The line ``pto generate`` prints after the text (the speed)."""


def generator() -> TextGenerator:
    """The installed text generator (the first registered name, sorted); UsageError when none is."""
    eps = plugins.group(GROUP)
    if not eps:
        raise UsageError("no installed program generates text")
    name = sorted(eps)[0]
    obj = plugins.load(GROUP, name, "text generator")
    gen = obj() if isinstance(obj, type) else obj
    if not isinstance(gen, TextGenerator):
        raise UsageError(f"text generator {name!r}: entry point {eps[name].value} is not a "
                         "pto.generation.TextGenerator")
    return gen


__all__ = ["GenerateRequest", "Flag", "flags", "TextGenerator", "generator", "GROUP"]
