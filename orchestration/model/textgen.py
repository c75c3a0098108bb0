"""``pto generate``: a checkpoint and prompts in, text out, streamed as it is generated, then the
speed of the prompt (prefill) and of decoding (milliseconds per token, tokens per second).

``--gguf FILE`` or ``--hf DIR`` names the model (its configuration, weights and tokenizer);
``--prompt TEXT`` (repeatable, or ``--batch B`` copies of one prompt) the prompts, wrapped in the
file's chat template with ``--chat``. Greedy decoding by default (the reference for the tokens is
transformers' ``generate`` on the same file, tests/programs/model); ``--temperature`` above 0
samples, restricted by ``--top-k`` and ``--top-p``, from a generator seeded with ``--seed``.
``--tp N`` under ``torchrun --nproc-per-node N`` splits every layer over N ranks (tensor
parallelism, :mod:`.generate`); rank 0 streams and reports. A GGUF file's quantized weights run
as the file stores them (``--dequantize``: floats, as before; a type that has no kernel, or a
projection whose layers mix types, is dequantized with one line on stderr saying which and why);
``--quantize fp8|q8_0|q4_0`` quantizes float weights at load (:mod:`.quantized`). The report
gives the weights' resident bytes and the bytes a step reads of them.
"""

from __future__ import annotations

from dataclasses import dataclass

from pto.errors import UsageError


@dataclass(frozen=True)
class Request:
    """What ``pto generate`` was asked: the model's file or folder, the prompts, and how."""

    path: str
    prompts: tuple[str, ...]
    max_new_tokens: int = 64
    chat: bool = False
    device: str = "auto"
    dtype: str | None = None
    executor: str = "auto"
    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int = 0
    tp: int = 1
    allreduce_dtype: str = "storage"
    dequantize: bool = False
    quantize: str | None = None


def _check(req: Request) -> None:
    import os

    if not os.path.exists(req.path):
        raise UsageError(f"{req.path}: no such file or folder")
    if not req.prompts or any(not p for p in req.prompts):
        raise UsageError("--prompt: every prompt needs some text")
    if req.max_new_tokens < 1:
        raise UsageError(f"--max-new-tokens must be positive, got {req.max_new_tokens}")
    _sampler(req)  # its values checked before any work


def _sampler(req: Request):
    from pto.orchestration.model.sampling import Sampler

    if req.temperature == 0 and (req.top_k is not None or req.top_p is not None):
        raise UsageError("--top-k and --top-p restrict sampling: give --temperature above 0 too (0 is greedy)")
    try:
        return Sampler(req.temperature, req.top_k, req.top_p, req.seed)
    except UsageError as e:
        raise UsageError(f"--{e}") from None


def run(req: Request, stream=None) -> dict:
    """Generate for ``req``; with ``stream`` (a text file) the first sequence's text is written
    to it as it is generated. Returns the JSON-able result: the texts, token counts, timings."""
    import sys

    from pto.orchestration.model.checkpoint import load_weights
    from pto.orchestration.model.generate import Generator
    from pto.orchestration.model.quantized import KeepFileTypes, WeightTypes, quantize_weights, weight_bytes
    from pto.orchestration.model.tokenizer import load_tokenizer

    from pto import dist
    from pto.device import resolve_device
    from pto.ir.dtypes import DType, dtype_of

    _check(req)
    if req.tp > 1:  # the heads must divide among the ranks: one line before any launch or load
        from pto.orchestration.model.config import load_config

        try:
            load_config(req.path).shard(req.tp)
        except ValueError as e:
            raise UsageError(f"--tp {req.tp}: {e}") from None
    device = resolve_device(req.device)
    if dist.init(device, req.tp, command="generate") != 0:
        stream = None  # every rank makes the same tokens: rank 0 shows them
    dtype = dtype_of(req.dtype) if req.dtype not in (None, "auto") else (DType.BF16 if device == "cuda" else DType.F32)
    tok = load_tokenizer(req.path)
    keep = None if req.dequantize or req.quantize else KeepFileTypes()
    if keep is not None and req.tp > 1:  # (quantized weights run on one rank)
        print(f"pto generate: --tp {req.tp}: the weights are dequantized at load (quantized weights run on one rank)",
              file=sys.stderr)
        keep = None
    weights = load_weights(req.path, dtype.torch, keep=keep)
    for note in keep.notes if keep is not None else ():
        print(f"pto generate: {note}", file=sys.stderr)
    if req.quantize:
        weights = quantize_weights(weights, req.quantize)
    prompts = [tok.encode_chat([{"role": "user", "content": p}]) if req.chat else tok.encode(p) for p in req.prompts]
    longest = max(map(len, prompts)) + req.max_new_tokens
    if longest > weights.config.max_positions and not weights.config.layer.window:
        raise UsageError(f"the prompt ({max(map(len, prompts))} tokens) and --max-new-tokens {req.max_new_tokens} "
                         f"exceed the model's context of {weights.config.max_positions} tokens")
    gen = Generator(weights, device, dtype, executor=req.executor, tp=req.tp, allreduce_dtype=req.allreduce_dtype)
    decoders = [tok.stream() for _ in prompts]
    texts = [""] * len(prompts)

    def on_step(new):
        for i, t in enumerate(new):
            if t is not None and t not in weights.config.eos_ids:
                piece = decoders[i].push(t)
                texts[i] += piece
                if i == 0 and stream is not None:
                    stream.write(piece)
                    stream.flush()

    try:
        result = gen.generate(prompts, req.max_new_tokens, on_step, sampler=_sampler(req))
    finally:
        gen.close()
    for i, d in enumerate(decoders):
        rest = d.flush()
        texts[i] += rest
        if i == 0 and stream is not None:
            stream.write(rest + "\n")
            stream.flush()
    nbytes = weight_bytes(weights)
    stored = {"types": WeightTypes.of(weights).to_json(), "resident_bytes": nbytes["resident"],
              "step_read_bytes": nbytes["step_read"]}
    return {"model": req.path, "device": device, "dtype": dtype.short, "texts": texts, "tokens": result.tokens,
            **result.to_json(), "weights": stored}


def format_speed(res: dict) -> str:
    """The line ``pto generate`` prints after the text."""
    ms = res["ms_per_token"]
    per = f"{ms:.3f} ms per token ({res['tokens_per_s']:,.0f} tokens/s)" if ms else "no decode step"
    w = res.get("weights")
    types = ", ".join(sorted(set(w["types"].values()))) if w and w["types"] else res["dtype"]
    weights = "" if w is None else (f"; weights {w['resident_bytes'] / 1e6:,.1f} MB ({types}), "
                                    f"{w['step_read_bytes'] / 1e6:,.1f} MB read a step")
    return (f"prompt {sum(res['prompt_tokens'])} tokens in {res['prefill_ms']:.0f} ms; decode {per}, "
            f"{res['steps']} steps of {res['tasks_per_step']:,} tasks ({res['executor']} executor, "
            f"{res['device']}, {res['dtype']}, batch {len(res['tokens'])}, cache {res['cache']}){weights}")


__all__ = ["Request", "run", "format_speed"]
