"""What a decode step gains when the o projection's weights stream into the L2 on a second stream
while the attention phase runs (issue 45; H200, sm_90).

A layer's attention phase (RoPE, the attention parts, the combine) reads a few MB and leaves the
HBM idle for several microseconds, and then the o projection streams its weights (32 MB a layer on
the 8B). The seventh session's ``bench/l2_prefetch.py`` found that a prefetch issued by the phase's
own kernels costs them what it saves the GEMV (a program does not retire before its bulk prefetches
land) and left "a prefetch on a second stream, beside the latency-bound phase" unbuilt. This builds
it around the wave executor's step without changing pto: after the step's first run, the recorded
launches get, right after each layer's q/k/v projection (``--after``), a fork to a side stream
that prefetches that layer's rows of ``--weights`` (``cp.async.bulk.prefetch.L2`` in chunks, or
one ``prefetch.global.L2`` a line), and one join at the step's end; the CUDA graph is captured from
those launches (the main stream's kernels keep their programmatic launches). The step with and
without, alternated ``--pairs`` times, each a fresh capture (after three throwaway graphs, so all
are in the same state: bench/decode.py's ``settle_graphs``), ms per token; the next token of both
must agree (from one token
and position).

    python3 bench/side_prefetch.py [--configs llama3-8b,llama3.2-1b,smollm2-135m] [--weights wo]
                                   [--after w_qkv] [--mode bulk|lines] [--programs 32] [--chunk-kb 16]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from decode import events_rounds, half_filled, settle_graphs  # noqa: E402
from pto.orchestration.llm.generate import Generator  # noqa: E402
from pto.orchestration.model.program import CONFIGS, random_weights  # noqa: E402

from pto.ir.dtypes import DType  # noqa: E402


@triton.jit
def _prefetch(w, nbytes, CHUNK: tl.constexpr, PER: tl.constexpr, LINES: tl.constexpr):
    """Program p prefetches chunks p * PER .. p * PER + PER - 1 of CHUNK bytes of the ``nbytes`` at
    ``w`` into the L2: each as one bulk prefetch, or (LINES) one ``prefetch.global.L2`` a 128-byte
    line."""
    pid = tl.program_id(0)
    base = w.to(tl.pointer_type(tl.int8))
    if LINES:
        for i in range(PER):
            off = (pid * PER + i).to(tl.int64) * CHUNK + tl.arange(0, CHUNK // 128).to(tl.int64) * 128
            ok = (off < nbytes).to(tl.int32)
            tl.inline_asm_elementwise(
                "{ .reg .pred p; setp.ne.s32 p, $2, 0; @p prefetch.global.L2 [$1]; mov.u32 $0, 0; }",
                "=r,l,r", [base + off, ok], dtype=tl.int32, is_pure=False, pack=1)
    else:
        off = (pid * PER + tl.arange(0, PER)).to(tl.int64) * CHUNK
        size = tl.where(off < nbytes, tl.minimum(nbytes - off, CHUNK), 0).to(tl.int32)
        tl.inline_asm_elementwise(
            "{ .reg .pred p; setp.ne.s32 p, $2, 0; @p cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }",
            "=r,l,r", [base + off, size], dtype=tl.int32, is_pure=False, pack=1)


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def with_prefetch(launches: list, batches: list, tensors: dict, layers: int, weights: str, after: str,
                  programs: int, chunk: int, lines: bool) -> tuple[list, int]:
    """``launches`` with a side stream's L2 prefetch of each layer's share of ``tensors[weights]``
    forked after the launch of that layer that reads ``tensors[after]``, and joined at the end;
    the number of forks."""
    w, a = tensors[weights], tensors[after]
    nbytes = w.numel() * w.element_size()
    if nbytes % layers:
        raise SystemExit(f"{weights}: {nbytes} bytes are not {layers} layers' equal shares")
    share = nbytes // layers
    per = triton.next_power_of_2(triton.cdiv(triton.cdiv(share, chunk), programs))
    flat = w.view(-1).view(torch.uint8) if w.element_size() != 1 else w.view(-1)
    side = torch.cuda.Stream()
    forks = [i for i, b in enumerate(batches) if any(_storage(m.tensor) == _storage(a) for m in b.mems.values())]
    if not forks or len(forks) % layers:
        raise SystemExit(f"{len(forks)} launches read {after}, not a whole number a layer ({layers})")
    forks = forks[len(forks) // layers - 1::len(forks) // layers]  # each layer's last

    def fork(layer: int):
        part = flat[layer * share:(layer + 1) * share]

        def go():
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                _prefetch[(programs,)](part, share, CHUNK=chunk, PER=per, LINES=lines)
        return go

    def join():
        torch.cuda.current_stream().wait_stream(side)

    out = []
    for i, launch in enumerate(launches):
        out.append(launch)
        if i in forks:
            out.append(fork(forks.index(i)))
    out.append(join)
    return out, len(forks)


def measure(config: str, batch: int, cache: int, steps: int, pairs: int, args) -> dict:
    w = random_weights(CONFIGS[config], torch.bfloat16, torch.Generator().manual_seed(0))
    gen = Generator(w, "cuda", DType.BF16, executor="waves")
    try:
        step = gen.step(batch, cache)
        batches: list = []
        step.executor.on_batch = batches.append
        one = half_filled(step, w.config.vocab, batch, cache)
        tok0 = step.tensors["tok"].clone()  # (each replay feeds the next its token: the check starts here)
        ex = step.executor
        if len(batches) != len(ex.launches):
            raise SystemExit(f"{len(batches)} batches for {len(ex.launches)} launches")
        plain = list(ex.launches)
        side, forks = with_prefetch(plain, batches, step.tensors, w.config.layers, args.weights, args.after,
                                    args.programs, args.chunk_kb << 10, args.mode == "lines")
        out = {"config": config, "batch": batch, "cache": cache, "launches": len(plain), "forks": forks,
               "weights": args.weights, "mode": args.mode, "programs": args.programs, "chunk_kb": args.chunk_kb}
        tokens = {}
        for name in ["plain", "prefetch"] * pairs:
            ex.launches = plain if name == "plain" else side
            if step.cuda_graph is not None:
                step.cuda_graph.reset()
                step.cuda_graph = None
            ms = statistics.median(events_rounds(one, steps))
            out.setdefault(name, []).append(round(ms, 4))
            step.tensors["tok"].copy_(tok0)
            one()
            tokens[name] = step.tensors["tok"].clone()
        out["same_token"] = bool(torch.equal(tokens["plain"], tokens["prefetch"]))
        out["gain"] = round(1 - statistics.median(out["prefetch"]) / statistics.median(out["plain"]), 4)
        return out
    finally:
        gen.close()
        torch.cuda.empty_cache()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", default="llama3-8b,llama3.2-1b,smollm2-135m")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--cache", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--weights", default="wo", help="the stacked weight whose layer rows are prefetched")
    ap.add_argument("--after", default="w_qkv", help="the fork follows the launch of each layer that reads this")
    ap.add_argument("--mode", choices=("bulk", "lines"), default="bulk")
    ap.add_argument("--programs", type=int, default=32)
    ap.add_argument("--chunk-kb", type=int, default=16)
    args = ap.parse_args(argv)
    print(torch.cuda.get_device_name(), "triton", triton.__version__, flush=True)
    settle_graphs()
    for config in args.configs.split(","):
        print(json.dumps(measure(config, args.batch, args.cache, args.steps, args.pairs, args)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
