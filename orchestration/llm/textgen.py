"""``pto generate``'s answer (:data:`GENERATOR`, the ``llm`` entry point of the
``pto.generators`` group): a checkpoint and prompts in, text out, streamed as it is generated,
then the speed of the prompt (prefill) and of decoding (milliseconds per token, tokens per
second); ``--json`` adds where the time before the first token went (``load_ms``: the tokenizer
and the weights; ``prepare_ms``: the decode step's graph and its inputs on the device;
``prefill_prepare_ms``: the prefill layer's graph and kernels, compiled on a first run;
``prefill_ms``: the prompt through the layers; ``first_step_ms``: the first step, kernels loaded).

The request (:class:`pto.generation.GenerateRequest`) names the model (``--gguf FILE`` or
``--hf DIR``: its configuration, weights and tokenizer) and the prompts (repeatable, or
``--batch B`` copies of one), wrapped in the file's chat template with ``--chat``. Greedy
decoding by default (the reference for the tokens is transformers' ``generate`` on the same
file, tests/programs/model); ``--temperature`` above 0 samples, restricted by ``--top-k`` and
``--top-p``, from a generator seeded with ``--seed``. ``--tp N`` under ``torchrun
--nproc-per-node N`` splits every layer and the LM head over N ranks (tensor parallelism,
:mod:`.generate`); rank 0 streams and reports, with its sums over the ranks (``collectives``). A
GGUF file's quantized weights run as the file stores them (``--dequantize``: floats, as before; a
type that has no kernel, or a projection whose layers mix types, is dequantized with one line on
stderr saying which and why); ``--quantize fp8|q8_0|q4_0`` quantizes float weights at load
(:mod:`pto.orchestration.model.quantized`). The report gives the weights' resident bytes and the
bytes a step reads of them, and the dense copies of quantized matrices the prefill keeps where it
made any (``prefill_dense_bytes``: the dequantizer's buffers).
"""

from __future__ import annotations

import time
from functools import partial
from typing import TextIO

from pto.errors import UsageError
from pto.generation import GenerateRequest
from pto.program import without_tp


def _check(req: GenerateRequest) -> None:
    """Everything the request alone can tell wrong, one line each, before any work."""
    import os

    path, prompts = req.path, req.sequences
    flag = "--gguf" if req.gguf else "--hf"
    if not os.path.exists(path):
        raise UsageError(f"{flag} {path}: no such file or folder")
    if req.gguf and os.path.isdir(path):
        raise UsageError(f"--gguf {path}: a folder, not a GGUF file (a Hugging Face folder goes to --hf)")
    if req.hf and not os.path.isdir(path):
        raise UsageError(f"--hf {path}: a file, not a Hugging Face folder (a GGUF file goes to --gguf)")
    if not prompts:
        raise UsageError("give --prompt TEXT: the text to continue (repeat it for a batch)")
    if any(not p for p in prompts):
        raise UsageError("--prompt: every prompt needs some text")
    if req.max_new_tokens < 1:
        raise UsageError(f"--max-new-tokens must be positive, got {req.max_new_tokens}")
    if req.allreduce_dtype is not None and req.tp == 1:
        raise without_tp("--allreduce-dtype", req.allreduce_dtype)
    _sampler(req)  # its values checked before any work


def _sampler(req: GenerateRequest):
    from pto.orchestration.llm.sampling import Sampler

    try:
        sampler = Sampler(req.temperature, req.top_k, req.top_p, req.seed)
    except UsageError as e:
        raise UsageError(f"--{e}") from None
    if req.temperature == 0 and (req.top_k is not None or req.top_p is not None):
        raise UsageError("--top-k and --top-p restrict sampling: give --temperature above 0 too (0 is greedy)")
    return sampler


def run(req: GenerateRequest, stream: TextIO | None = None) -> dict:
    """Generate for ``req``; with ``stream`` (a text file) the first sequence's text is written
    to it as it is generated, then the others' (a batch's texts each under :func:`sequence_label`).
    Returns the JSON-able result: the texts, token counts, timings."""
    import sys

    from pto.orchestration.llm.generate import Generator
    from pto.orchestration.llm.tokenizer import load_tokenizer
    from pto.orchestration.model.checkpoint import load_weights
    from pto.orchestration.model.gguf_file import given_as, is_gguf
    from pto.orchestration.model.quantized import KeepFileTypes, WeightTypes, quantize_weights, weight_bytes

    from pto.ir.dtypes import dtype_of
    from pto.machine import collectives, dist
    from pto.machine.device import resolve_device
    from pto.program import default_dtype

    _check(req)
    model = partial(given_as, "--gguf" if req.gguf else "--hf", req.path)  # its errors name the flag
    dist.check_launch(req.tp, "generate")  # started by torchrun as --tp says, before any file is read
    if req.gguf and not is_gguf(req.gguf):  # (the readers take a folder too: "neither ... nor")
        raise UsageError(f"--gguf {req.gguf}: not a GGUF file (it does not begin with GGUF's magic bytes)")
    if req.tp > 1:  # the heads must divide among the ranks: one line before any launch or load
        from pto.orchestration.model.config import load_config

        try:
            with model():
                cfg = load_config(req.path)
            cfg.shard(req.tp)
        except ValueError as e:
            raise UsageError(f"--tp {req.tp}: {e}") from None
    device = resolve_device(req.device)
    if dist.init(device, req.tp, command="generate") != 0:
        stream = None  # every rank makes the same tokens: rank 0 shows them
    collectives.check()  # PTO_COLLECTIVES and its limits, before any file is read
    dtype = default_dtype(device) if req.dtype == "auto" else dtype_of(req.dtype)
    t0 = time.perf_counter()
    with model():
        tok = load_tokenizer(req.path)
    t1 = time.perf_counter()
    keep = None if req.dequantize or req.quantize else KeepFileTypes()
    if keep is not None and req.tp > 1:  # (quantized weights run on one rank)
        print(f"pto generate: --tp {req.tp}: the weights are dequantized at load (quantized weights run on one rank)",
              file=sys.stderr)
        keep = None
    with model():
        weights = load_weights(req.path, dtype.torch, keep=keep)
    for note in keep.notes if keep is not None else ():
        print(f"pto generate: {note}", file=sys.stderr)
    if req.quantize:
        weights = quantize_weights(weights, req.quantize)
    load_ms = {"tokenizer": round((t1 - t0) * 1e3, 3), "weights": round((time.perf_counter() - t1) * 1e3, 3)}
    prompts = [tok.encode_chat([{"role": "user", "content": p}]) if req.chat else tok.encode(p)
               for p in req.sequences]
    longest = max(map(len, prompts)) + req.max_new_tokens
    if longest > weights.config.max_positions and not weights.config.layer.window:
        raise UsageError(f"the prompt ({max(map(len, prompts))} tokens) and --max-new-tokens {req.max_new_tokens} "
                         f"exceed the model's context of {weights.config.max_positions} tokens")
    gen = Generator(weights, device, dtype, executor=req.executor, tp=req.tp,
                    allreduce_dtype=req.allreduce_dtype or "storage")
    decoders = [tok.stream() for _ in prompts]
    texts = [""] * len(prompts)
    if stream is not None and len(prompts) > 1:  # the others follow, each under its own label
        stream.write(sequence_label(1))

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
    if stream is not None:  # the batch's other sequences, whole
        for i, text in enumerate(texts[1:], start=2):
            stream.write(f"{sequence_label(i)}{text}\n")
        stream.flush()
    nbytes = weight_bytes(weights)
    stored = {"types": WeightTypes.of(weights).to_json(), "resident_bytes": nbytes["resident"],
              "step_read_bytes": nbytes["step_read"]}
    if gen.prefill_buffer_bytes:  # dense copies of quantized matrices the prefill kept
        stored["prefill_dense_bytes"] = gen.prefill_buffer_bytes
    out = {"model": req.path, "device": device, "dtype": dtype.short, "texts": texts, "tokens": result.tokens,
           "load_ms": load_ms, **result.to_json(), "weights": stored}
    if req.tp > 1:  # this rank's sums over the ranks, by algorithm (pto.machine.collectives)
        out["collectives"] = dist.counters()
    return out


def sequence_label(i: int) -> str:
    """The line above the text of sequence ``i`` (from 1) when a batch prints several."""
    return f"--- sequence {i}:\n"


def _figure(x: float) -> str:
    """Three significant digits below 100 (0.4 tokens/s on a CPU printed as 0, a 40 us prefill as
    0 ms), whole numbers above."""
    return f"{x:,.0f}" if x >= 100 else f"{x:.3g}"


def _prompt(res: dict) -> str:
    """The prompt's part of the speed line: its tokens and the prefill's time, or, where every
    prompt is one token (the first step reads it: nothing is prefilled), no time at all."""
    n = sum(res["prompt_tokens"])
    if n == len(res["prompt_tokens"]):
        return f"prompt {n} token{'s' if n > 1 else ''}, read by the first step (no prefill)"
    return f"prompt {n} tokens in {_figure(res['prefill_ms'])} ms"


def format_speed(res: dict) -> str:
    """The line ``pto generate`` prints after the text."""
    ms = res["ms_per_token"]
    # the rate from the milliseconds: the JSON's tokens_per_s is rounded to 0.1
    per = f"{ms:.3f} ms per token ({_figure(len(res['tokens']) * 1e3 / ms)} tokens/s)" if ms else "no decode step"
    w = res.get("weights")
    types = ", ".join(sorted(set(w["types"].values()))) if w and w["types"] else res["dtype"]
    weights = "" if w is None else (f"; weights {w['resident_bytes'] / 1e6:,.1f} MB ({types}), "
                                    f"{w['step_read_bytes'] / 1e6:,.1f} MB read a step")
    if w and w.get("prefill_dense_bytes"):
        weights += f", {w['prefill_dense_bytes'] / 1e6:,.1f} MB of dense copies for the prefill"
    return (f"{_prompt(res)}; decode {per}, "
            f"{res['steps']} steps of {res['tasks_per_step']:,} tasks ({res['executor']} executor, "
            f"{res['device']}, {res['dtype']}, batch {len(res['tokens'])}, cache {res['cache']}){weights}")


class TextGeneration:
    """The :class:`pto.generation.TextGenerator` of this package: :func:`run`, :func:`format_speed`."""

    def generate(self, request: GenerateRequest, stream: TextIO | None = None) -> dict:
        return run(request, stream)

    def describe(self, result: dict) -> str:
        return format_speed(result)


GENERATOR = TextGeneration()

__all__ = ["run", "format_speed", "sequence_label", "TextGeneration", "GENERATOR"]
