"""Decode speed: milliseconds per token of one step of a whole model (every sequence of the batch
one new token), ours against transformers in the same run, random weights of the real
configurations (bf16, a GPU).

    python bench/decode.py [--configs smollm2-135m,llama3-8b] [--batches 1,8,32] [--cache 1024]
                           [--long 32768] [--steps 64] [--json FILE] [--hf-configs NAMES] [--hf-batches 1]
                           [--tilings 'default;bn=32;bn=16,bk=128;+ffn_bk=1024'] [--branches]

Ours: the decode step's graph (:mod:`pto.orchestration.model.decode`) prepared once and replayed
as a CUDA graph, ``--steps`` steps timed with CUDA events in three rounds (no host read between
steps within a round), each executor: the median round's ms a step (``ms_rounds``: each
round's). The cache is filled to half its capacity first (random keys and values: the speed of
attention depends on the length, not the values). transformers, in a child process (a crash of its
compiled step is its row's error): its LlamaForCausalLM with a static cache,
``torch.compile(mode="reduce-overhead")`` of the one-token forward, the same positions,
timed the same way. The HBM floor: the bytes every step must read
(the weights once, the cache up to the position) over the bandwidth of a large copy measured
here; each run's ``x_floor`` is the floor over its time. For the persistent executor, a traced
run's scheduling cost per work item (``item_gap_us``),
the median time from a task's last predecessor's end to its start (``dependency_wait_us``),
its critical path's waits, items and spread (``critical_path_us``, per InCore function: where a
step's latency goes; ``item_path_us`` item by item, each gap a dependency's wait or its program's
dispatch) and its busy time per InCore function; its megakernel's registers, spills,
shared memory and programs a multiprocessor (per segment where the plan is split,
``PTO_MK_SPLIT``), and with ``--branches`` each branch's compiled alone in a one-branch
megakernel (a compile per branch). For the wave executor, each compiled kernel's registers,
spills, shared memory, warps and stages (``compiled``). Correctness is not measured here:
tests/gpu/test_decode_gpu.py checks the same step's bf16 logits against float64.

Quantized weights (``--quant bf16,q4_k/q6_k,q8_0,fp8``: per spec ``LAYERS[/HEAD]``, the layers'
matrices and the LM head, a tied model's embedding with its head; random blocks of the real
shapes, pto's quantizers for fp8, q8_0 and q4_0): per configuration, batch and spec our step's
ms per token (the waves executor, or ``--executors``), the floor at the bytes the spec reads a
step (its weights, the cache to half its capacity, over the copy bandwidth), the weights'
resident bytes on the GPU (the step's input tensors) against a GGUF file's tensor bytes of the
same types, and the prefill of a ``--prefill``-token prompt (the layer program, each layer's
quantized weights dequantized on the device first, or with ``--quant-prefill dequantize,native``
once so and once as stored, ``PTO_QUANT_PREFILL``)::

    python bench/decode.py --configs llama3-8b,smollm2-135m --batches 1,8 \
        --quant bf16,q8_0,fp8,llama3-8b:q4_k/q6_k,smollm2-135m:q4_1/q8_0

``--qgemv units,groups`` runs each quantized spec's step once per way the GEMVs read the weights
(``PTO_QGEMV``; the key ``EXECUTOR[TILING]/MODE``), and a ``--tilings`` entry ``MODE:TILING``
runs in that mode only (a dense spec skips ``groups:`` entries), so one call compares them::

    python bench/decode.py --configs llama3-8b --batches 1 --quant 'bf16,llama3-8b:q4_k/q6_k,q8_0,fp8' \
        --tilings 'units:default;groups:default;groups:ffn_bn=4,ffn_bk=1024' --prefill 0

Tensor parallelism: under ``torchrun --nproc-per-node N`` every rank runs its share of the step
(``tp{N}[MODE,HEAD]``: the slowest rank's ms, the sums inside the replayed CUDA graph), once per
``--collectives`` mode (``PTO_COLLECTIVES``: ``auto``, symmetric memory's one-shot all-reduce for
the step's small sums where it runs; ``group``, NCCL for every sum) and ``--lm-heads`` (the LM
head vocabulary-parallel or replicated); then PyTorch's hand-written tensor-parallel step
(bench/torch_tp.py: the same split, NCCL, the head vocabulary-parallel, captured in a CUDA graph;
``torch_tp{N}``); then rank 0 the whole step alone, ours and PyTorch's (``tp1``, ``torch_tp1``,
the others waiting), and the scaling efficiency ``t1 / (N tN)`` of each. Per variant and rank the
collectives' GPU time per step, their share of the step and how much of it overlaps compute (a
profiler trace of a few replays) and the first run's sums by algorithm. The waves executor and
the default tiling only (the persistent executor runs no collectives), at ``--cache``
(``--long``, ``--tilings`` and ``--hf-*`` are not read)::

    torchrun --nproc-per-node 2 bench/decode.py --configs llama3-8b --batches 1,8 --json tp2.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
# rank 0's single-process step (a cold compile of every kernel) keeps the other ranks waiting
os.environ.setdefault("PTO_DIST_TIMEOUT_S", "3600")

from pto.orchestration.llama.reference import rope_tables  # noqa: E402
from pto.orchestration.llm.generate import Generator  # noqa: E402
from pto.orchestration.model.decode import DecodeTiling  # noqa: E402
from pto.orchestration.model.program import CONFIGS, random_weights, tiling_for, tiling_for_executor  # noqa: E402

from pto.codegen.triton.common import QGEMV_MODES  # noqa: E402
from pto.errors import UsageError  # noqa: E402
from pto.exec import timing  # noqa: E402
from pto.ir.dtypes import DType, dtype_of  # noqa: E402
from pto.machine import collectives, dist  # noqa: E402
from pto.quant import QTensor  # noqa: E402


def write_rows(path: str, bw: float, rows: list[dict]) -> None:
    """``--json``: the device, its copy bandwidth and every row."""
    Path(path).write_text(json.dumps({"device": torch.cuda.get_device_name(0), "bandwidth": bw, "rows": rows},
                                     indent=1))


#: the rounds a step's time is the median of (:func:`events_ms`)
ROUNDS = 3


def copy_bandwidth() -> float:
    """Bytes per second of a large device-to-device copy (read + write)."""
    x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    for _ in range(3):
        y.copy_(x)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(10):
        y.copy_(x)
    torch.cuda.synchronize()
    return 2 * x.numel() * 10 / (time.perf_counter() - t0)


def events_rounds(fn, steps: int, rounds: int = ROUNDS) -> list[float]:
    """Milliseconds per call of ``fn`` in each of ``rounds`` rounds of ``steps / rounds`` calls
    rounded up (at least ``steps`` in all), CUDA events around each round's loop, after one
    untimed call."""
    fn()
    torch.cuda.synchronize()
    per = max(1, -(-steps // rounds))
    out = []
    for _ in range(rounds):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(per):
            fn()
        b.record()
        torch.cuda.synchronize()
        out.append(a.elapsed_time(b) / per)
    return out


def events_ms(fn, steps: int) -> float:
    """Milliseconds per call of ``fn`` over ``steps`` calls: the median of :data:`ROUNDS` rounds
    (:func:`events_rounds`), so that one stall of the host or the GPU in a round (two
    measurements of sixteen about 3x slow on an H200, docs/PERF.md, "fifteenth session") does
    not become the result."""
    return statistics.median(events_rounds(fn, steps))


def parse_tiling(text: str, base: DecodeTiling, own: DecodeTiling | None = None) -> DecodeTiling | None:
    """``bn=32,bk=128`` -> the configuration's tiling ``base`` with those fields, quantized
    weights too (``dot_bk=none``: ``bk`` on the dot path too); ``+ffn_bk=1024`` -> the
    executor's own tiling ``own`` (the megakernel's on the persistent executor) with those
    fields; ``default`` -> None (``base`` itself)."""
    if text == "default":
        return None
    if text.startswith("+"):
        text, base = text[1:], own or base
    fields = dict(kv.split("=") for kv in text.split(","))
    return base.with_fields(**{k: None if v == "none" else int(v) for k, v in fields.items()})


def kernel_times(fn, steps: int) -> dict:
    """What the GPU ran during ``steps`` calls of ``fn`` (:func:`pto.exec.timing.kernel_times`): per
    kernel name its launches per step and its microseconds per launch, the device's busy time per
    step against the wall time per step (the rest is the gaps between kernels)."""
    per, wall_ms = timing.kernel_times(fn, steps)
    acc: dict[str, list] = {}
    for name, (n, ms) in per.items():
        a = acc.setdefault(name[:60], [0.0, 0.0])
        a[0] += n
        a[1] += ms * 1e3
    busy = sum(v[1] for v in acc.values())
    top = sorted(acc.items(), key=lambda kv: -kv[1][1])[:12]
    return {"wall_us_per_step": round(wall_ms * 1e3, 1), "busy_us_per_step": round(busy, 1),
            "per_kernel": {k: {"per_step": round(n, 1), "us_each": round(us / max(n, 1e-9), 2)}
                           for k, (n, us) in top}}


def timeline(fn, runs: int = 3) -> dict:
    """Where a step's time goes with its kernels overlapping (programmatic dependent launch): per
    kernel name (:func:`pto.exec.timing.frontier` over ``runs`` profiled calls of ``fn``) its
    launches per step and the medians of how far each launch moved the step's latest end (its
    share of the step: the advances sum to the step's span), of its own duration and of its start
    less its predecessor's end (negative: started before it ended); the step's span."""
    return timeline_of(timing.kernel_timeline(fn, runs))


def timeline_of(calls: list[list[tuple[str, float, float]]]) -> dict:
    """:func:`timeline`'s summary of profiled ``calls`` (:func:`pto.exec.timing.kernel_timeline`'s):
    per kernel name (its first 60 characters) its launches per call and the medians of its
    launches' advance, duration and lead, the kernels by their advance per call, most first."""
    per: dict[str, list] = {}
    for call in calls:
        for name, advance, busy, lead in timing.frontier(call):
            per.setdefault(name[:60], []).append((advance, busy, lead))
    spans = [max(e for _, _, e in call) for call in calls if call]
    out = {name: {"per_step": round(len(v) / max(len(calls), 1), 1),
                  "advance_us": round(statistics.median(a for a, _, _ in v), 2),
                  "busy_us": round(statistics.median(b for _, b, _ in v), 2),
                  "lead_us": round(statistics.median(ld for _, _, ld in v), 2)}
           for name, v in per.items()}
    return {"span_us": round(statistics.median(spans), 1) if spans else None,
            "kernels": dict(sorted(out.items(), key=lambda kv: -kv[1]["advance_us"] * kv[1]["per_step"]))}


def print_timeline(title: str, tl: dict) -> None:
    print(f"{title}: span {tl['span_us']} us a step; per kernel launches, advance / busy / lead us (medians)")
    for name, k in tl["kernels"].items():
        print(f"    {name:48} {k['per_step']:6.1f}  {k['advance_us']:8.2f} {k['busy_us']:8.2f} {k['lead_us']:8.2f}")


#: the decode steps this process has built so far (a row's ``process_step``), and the throwaway
#: CUDA graphs :func:`settle_graphs` made
BUILT = [0]
SETTLED = [0]


def settle_graphs(count: int = 3) -> None:
    """Make ``count`` throwaway CUDA graphs of one small kernel each (captured, never replayed).

    On the H200 the fourth CUDA graph a process captures with torch (``torch.cuda.graph``, as
    these are) slows the replay of every many-kernel graph of the process from then on by 10-15%
    (the wave executor's SmolLM2 step 0.394-0.400 -> 0.445-0.454 ms; freeing the graphs does not
    undo it; the persistent executor's single launch does not move; bench/step_order.py,
    docs/PERF.md "Twenty-fourth session"). Our steps are each a graph, so in a process that times
    more than three, the first three are in the faster state and the rest in the slower one.
    ``--settle`` makes three graphs first, so that every step of the process is timed in the
    slower state and rows compare like with like (a row's ``graphs_before``: the steps timed
    before its own and the throwaway graphs; a prefill's graph, where ``--quant`` times one, is
    not counted)."""
    x = torch.zeros(16, device="cuda")
    for _ in range(count):  # (each freed at once: freeing does not undo the state)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            x.add_(1.0)
    torch.cuda.synchronize()
    SETTLED[0] += count


def half_filled(step, vocab: int, batch: int, cache: int):
    """``step`` (a decode step of ``batch`` sequences and ``cache`` slots) at half its cache: random
    keys and values, the same seeded tokens on every rank; its first run (it compiles, fits the
    megakernel, uploads the plan); then a call that replays it at that position every time (the
    cost at that length)."""
    t = step.tensors
    t["k_cache"].normal_()
    t["v_cache"].normal_()
    t["pos"].fill_(cache // 2)
    t["tok"].copy_(torch.randint(0, vocab, (batch, 1), generator=torch.Generator().manual_seed(0)))
    step()
    torch.cuda.synchronize()
    start = t["pos"].clone()

    def one():
        t["pos"].copy_(start)
        step.replay()

    return one


def ours(w, batch: int, cache: int, executor: str, steps: int, tiling: DecodeTiling | None = None,
         kernels: bool = False, tp: int = 1, vocab_parallel: bool = True, comm: bool = False,
         branches: bool = False, records: str | None = None, overlap: bool = False) -> dict:
    """Our step at half the cache's capacity: ms per step, its graph's size and where the time
    goes (each InCore function's kernel time); ``tp`` > 1: this rank's share of the step, its
    LM head vocabulary-parallel or not, and (``comm``) its collectives' profile and the first
    run's sums by algorithm. What the kernels need: the persistent executor's megakernels per
    segment (``report``: registers, spills, shared memory, programs a multiprocessor) and, with
    ``branches``, each branch compiled alone (``branches``: a compile per branch); the wave
    executor's compiled kernels (``compiled``). ``records``: where to save the persistent
    executor's traced items (``save`` of bench/records.py, which studies them off the GPU);
    ``overlap``: the wave executor's kernels as they overlap (:func:`timeline`)."""
    gen = Generator(w, "cuda", DType.BF16, executor=executor, tiling=tiling, tp=tp, vocab_parallel=vocab_parallel)
    try:
        step = gen.step(batch, cache)
        dist.counters(reset=True)
        one = half_filled(step, w.config.vocab, batch, cache)
        sums = dist.counters(reset=True)
        rounds = events_rounds(one, steps)
        ms = statistics.median(rounds)
        BUILT[0] += 1
        if BUILT[0] + SETTLED[0] == 4 and not SETTLED[0]:
            print("note: this is the fourth step timed in this process; from here the GPU replays every CUDA graph "
                  "slower (10-15% on SmolLM2's steps on an H200): compare rows of like graphs_before, or "
                  "run with --settle", flush=True)
        out = {"ms": round(ms, 4), "ms_rounds": [round(r, 4) for r in rounds], "tasks": step.graph.tasks,
               "process_step": BUILT[0], "graphs_before": BUILT[0] - 1 + SETTLED[0],
               "executor": step.executor.name,
               # the megakernel is one plain launch
               "pdl": (getattr(step.executor.backend, "pdl", "") or "off") if step.executor.name == "waves" else "off"}
        if kernels:
            out["kernels"] = kernel_times(one, 8)
        if overlap and step.executor.name == "waves":
            out["timeline"] = timeline(one)
        if comm:
            out.update(_comm(one), sums=sums["algorithms"])
        if step.executor.name == "persistent":
            out["report"] = step.executor.report()
            if records:
                from records import save as save_records  # (bench/records.py, beside this script)

                save_records(records, step.executor.trace_records(), step.executor.programs)
            if branches:
                try:
                    out["branches"] = step.executor.branch_resources()
                except Exception as e:  # a branch that compiles alone in no configuration: say so
                    out["branches_error"] = f"{type(e).__name__}: {str(e)[:300]}"
        elif hasattr(step.executor.backend, "compiled_kernels"):
            try:
                out["compiled"] = step.executor.backend.compiled_kernels()
            except Exception as e:  # Triton's caches are its own: report it, keep the timing
                out["compiled_error"] = f"{type(e).__name__}: {str(e)[:200]}"
        out["profile_ms"] = step.executor.profile()
        return out
    finally:
        gen.close()


def _comm(step) -> dict:
    """The collectives' profile of 8 calls of ``step`` (:func:`pto.exec.timing.comm_profile`), its
    longest kernels as ``comm_kernels``."""
    prof = timing.comm_profile(step, 8, cuda=True)
    return {**{k: v for k, v in prof.items() if k != "kernels"}, "comm_kernels": prof["kernels"]}


def torch_tp_step(w, batch: int, cache: int, steps: int, tp: int, rank: int, comm: bool = False) -> dict:
    """PyTorch's hand-written step (bench/torch_tp.py) on this rank, captured in a CUDA graph, at
    half the cache's capacity as :func:`ours`: ms per step, and (``comm``) its collectives'
    profile."""
    from torch_tp import TorchTPDecode  # (bench/torch_tp.py, beside this script)

    model = TorchTPDecode(w, tp, rank, batch, cache, rope_tables(w.config.max_positions, w.config.layer, DType.BF16,
                                                                  "cuda"))
    model.k.normal_()
    model.v.normal_()
    model.tok.copy_(torch.randint(0, w.config.vocab, (batch,), generator=torch.Generator().manual_seed(0)))
    start = torch.full_like(model.pos, cache // 2)
    model.pos.copy_(start)
    model.capture()

    def one():
        model.pos.copy_(start)
        model()

    out = {"ms": round(events_ms(one, steps), 4)}
    if comm:
        out.update(_comm(one))
    return out  # (the graph, NCCL calls captured in it, freed here: before the group is left)


def transformers_step(cfg, batch: int, cache: int, steps: int) -> dict:
    """transformers' LlamaForCausalLM (random weights), static cache, compiled one-token step."""
    import transformers
    from transformers import StaticCache

    c = cfg.layer
    hc = transformers.LlamaConfig(hidden_size=c.hidden, intermediate_size=c.ffn, num_attention_heads=c.heads,
                                  num_key_value_heads=c.kv_heads, head_dim=c.head_dim, num_hidden_layers=cfg.layers,
                                  vocab_size=cfg.vocab, rms_norm_eps=c.eps, rope_theta=c.theta,
                                  max_position_embeddings=max(cfg.max_positions, cache),
                                  tie_word_embeddings=cfg.tied)
    with torch.device("cuda"):
        model = transformers.LlamaForCausalLM(hc).to(torch.bfloat16).eval()
    kv = StaticCache(config=hc, max_batch_size=batch, max_cache_len=cache, device="cuda", dtype=torch.bfloat16)
    tok = torch.randint(0, cfg.vocab, (batch, 1), device="cuda")
    pos = torch.full((1,), cache // 2, device="cuda", dtype=torch.long)

    def forward():
        with torch.no_grad():
            return model(input_ids=tok, past_key_values=kv, cache_position=pos, use_cache=True).logits

    t0 = time.perf_counter()
    compiled = torch.compile(forward, mode="reduce-overhead", fullgraph=False)
    for _ in range(3):
        compiled()
    torch.cuda.synchronize()
    compile_s = time.perf_counter() - t0
    ms = events_ms(compiled, steps)
    return {"ms": round(ms, 4), "compile_s": round(compile_s, 1)}


def transformers_in_child(config: str, batch: int, cache: int, steps: int) -> dict:
    """:func:`transformers_step` in a child process of this script (``--transformers-step``): a
    crash of transformers' compiled step (inductor's launcher has died of a segmentation fault
    on the H200's torch 2.11 with transformers 5.17) is its row's error, ours are kept."""
    return child_json([sys.executable, __file__, "--transformers-step", f"{config},{batch},{cache},{steps}"])


def child_json(cmd: list[str], timeout: float = 900) -> dict:
    """The JSON object the last line of ``cmd``'s output is; RuntimeError saying how the process
    ended (the signal that killed it, its exit status and last line of errors, no result, or
    ``timeout`` seconds passed) where it printed none."""
    import signal
    import subprocess

    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"the child process ran past {timeout:g} s and was stopped") from None
    lines = proc.stdout.strip().splitlines()
    if proc.returncode == 0 and lines and lines[-1].startswith("{"):
        return json.loads(lines[-1])
    how = f"was killed by {signal.Signals(-proc.returncode).name}" if proc.returncode < 0 \
        else "printed no result" if proc.returncode == 0 else f"exited with status {proc.returncode}"
    last = (proc.stderr.strip().splitlines() or [""])[-1][:200]
    raise RuntimeError(f"the child process {how}" + (f": {last}" if last else ""))


def floor_ms(cfg, batch: int, cache: int, bw: float) -> float:
    c = cfg.layer
    params = cfg.vocab * c.hidden + cfg.layers * (  # the LM head, not the embedding (a row per token)
        c.hidden * (c.q_dim + 2 * c.kv_dim) + c.q_dim * c.hidden + 3 * c.hidden * c.ffn)
    kv = cfg.layers * batch * (cache // 2) * 2 * c.kv_dim
    return round((params + kv) * 2 / bw * 1e3, 4)


def hf_wanted(args, config: str, batch: int) -> bool:
    return ((args.hf_configs is None or config in args.hf_configs.split(","))
            and (args.hf_batches is None or str(batch) in args.hf_batches.split(",")))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", default="smollm2-135m,llama3-8b")
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--cache", type=int, default=1024)
    ap.add_argument("--long", type=int, default=32768, help="a long cache for batch 1 (0: none)")
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--executors", default="persistent,waves")
    ap.add_argument("--json", default=None)
    ap.add_argument("--kernels", action="store_true",
                    help="profile each step's kernels (torch.profiler): launches, time each, busy against wall "
                    "(with PTO_PDL=off: programmatic dependent launch counts a kernel's wait in its time)")
    ap.add_argument("--timeline", action="store_true",
                    help="the wave executor: how far each kernel moves the step's end with the kernels overlapping "
                         "as they run (programmatic dependent launch), its duration and its start against the "
                         "previous kernel's end (torch.profiler; medians per kernel name)")
    ap.add_argument("--branches", action="store_true",
                    help="the persistent executor: compile each branch alone (a one-branch megakernel) and report its "
                         "registers, spills and shared memory")
    ap.add_argument("--tilings", default="default",
                    help="decode tilings to compare, ';'-separated, e.g. 'default;bn=32;bn=16,bk=128'")
    ap.add_argument("--hf-configs", default=None, help="the configurations transformers runs (default: all)")
    ap.add_argument("--hf-batches", default=None, help="the batches transformers runs (default: all)")
    ap.add_argument("--quant", default=None, help="weight types to compare instead (module docstring), e.g. "
                    "'bf16,q8_0,llama3-8b:q4_k/q6_k' (CONFIG:SPEC: that configuration's alone); --executors "
                    "defaults to waves, --long to none")
    ap.add_argument("--prefill", type=int, default=512, help="with --quant: the timed prompt's tokens (0: none)")
    ap.add_argument("--quant-prefill", default=None, help="with --quant: the prefill once per way it takes quantized "
                    "weights (PTO_QUANT_PREFILL; keys prefill_ms/MODE), e.g. dequantize,native (default: the "
                    "environment's)")
    ap.add_argument("--qgemv", default=None, help="with --quant: each quantized spec's step once per way the GEMVs "
                    "read the weights (PTO_QGEMV), e.g. units,groups (default: the environment's)")
    ap.add_argument("--collectives", default="auto,group",
                    help="under torchrun: the PTO_COLLECTIVES modes ours runs with (default auto,group)")
    ap.add_argument("--lm-heads", default="parallel",
                    help="under torchrun: the LM heads ours runs with, parallel and/or replicated (default parallel)")
    ap.add_argument("--settle", action="store_true",
                    help="make three throwaway CUDA graphs first, so every step is timed in the state a process "
                         "reaches at its fourth graph (slower replays; settle_graphs): like with like across rows")
    ap.add_argument("--transformers-step", default=None, help=argparse.SUPPRESS)  # CONFIG,BATCH,CACHE,STEPS
    args = ap.parse_args(argv)
    if args.transformers_step:  # (transformers_in_child's child: one JSON line)
        config, batch, cache, steps = args.transformers_step.split(",")
        print(json.dumps(transformers_step(CONFIGS[config], int(batch), int(cache), int(steps))), flush=True)
        return 0
    env = dist.environment()
    if env is not None and env.world > 1:
        return main_tp(args, env.world)
    bw = copy_bandwidth()
    print(f"copy bandwidth {bw / 1e12:.2f} TB/s on {torch.cuda.get_device_name(0)}", flush=True)
    if args.settle:
        settle_graphs()
    if args.kernels and os.environ.get("PTO_PDL", "auto") not in ("off", ""):
        print(f"--kernels with PTO_PDL={os.environ.get('PTO_PDL', 'auto')}: a kernel launched early counts its wait "
              "for the one before in its time (PTO_PDL=off for each kernel's own)", flush=True)
    if args.quant:
        return main_quant(args, bw)
    rows = []
    for name in args.configs.split(","):
        cfg = CONFIGS[name]
        w = random_weights(cfg, torch.bfloat16, torch.Generator(device="cuda").manual_seed(0))
        shapes = [(int(b), args.cache) for b in args.batches.split(",")]
        if args.long and args.long <= cfg.max_positions:
            shapes.append((1, args.long))
        for batch, cache in shapes:
            row = {"config": name, "batch": batch, "cache": cache, "floor_ms": floor_ms(cfg, batch, cache, bw)}
            for tiling in args.tilings.split(";"):
                for ex in args.executors.split(","):
                    key = ex if tiling == "default" else f"{ex}[{tiling}]"
                    key += f" #{sum(k.split(' #')[0] == key for k in row) + 1}" if key in row else ""
                    try:
                        row[key] = ours(w, batch, cache, ex, args.steps,
                                        parse_tiling(tiling, tiling_for(cfg), tiling_for_executor(cfg, ex)),
                                        args.kernels, branches=args.branches, overlap=args.timeline)
                        row[key]["x_floor"] = round(row["floor_ms"] / row[key]["ms"], 3)
                        if "timeline" in row[key]:
                            print_timeline(f"{name} B={batch} {key}", row[key]["timeline"])
                    except Exception as e:  # report it, measure the rest
                        row[key] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
                    torch.cuda.empty_cache()
            if hf_wanted(args, name, batch):
                try:
                    row["transformers"] = transformers_in_child(name, batch, cache, args.steps)
                except Exception as e:  # another transformers: say so, keep ours
                    row["transformers_error"] = f"{type(e).__name__}: {str(e)[:200]}"
                torch.cuda.empty_cache()
            rows.append(row)
            print(json.dumps(row), flush=True)
        del w
        torch.cuda.empty_cache()
    if args.json:
        write_rows(args.json, bw, rows)
    for r in rows:
        cols = [f"{r['config']} B={r['batch']} cache={r['cache']}: floor {r['floor_ms']} ms"]
        cols += [f"{k} {v.get('ms', v.get('error'))} ms" for k, v in r.items()
                 if isinstance(v, dict) and k != "transformers"]
        if "transformers" in r:
            cols.append(f"transformers {r['transformers']['ms']} ms")
        print("; ".join(cols))
        for k, v in r.items():  # where a persistent step's latency goes
            if isinstance(v, dict):
                print("\n".join(path_lines(v.get("report", {}), f"    {k}: ")))
    return 0


def path_lines(report: dict, prefix: str = "    ", functions: int = 0) -> list[str]:
    """A persistent run's critical path and item path (``report``'s ``critical_path_us``, task
    by task, and ``item_path_us``, item by item: :mod:`pto.exec.trace`) as lines of text, each
    followed by its first ``functions`` InCore functions' shares."""
    lines = []
    cp, ip = report.get("critical_path_us"), report.get("item_path_us")
    if cp:
        lines.append(f"{prefix}critical path: {cp['tasks']} tasks, {cp['total']} us = wait {cp['wait']} + item "
                     f"{cp['item']} + spread {cp['spread']} + between launches {cp['launch']}")
        lines += [f"{prefix}  {f[:48]:48s} x{v['tasks']:<4d} wait {v['wait']} item {v['item']} spread {v['spread']}"
                  f"  items {v.get('items', '')} rounds {v.get('rounds', '')}"
                  for f, v in list(cp["by_function"].items())[:functions]]
    if ip:
        lines.append(f"{prefix}item path: {ip['items']} items, {ip['total']} us = wait {ip['wait']} + dispatch "
                     f"{ip['dispatch']} + item {ip['item']} + between launches {ip['launch']}")
        lines += [f"{prefix}  {f[:48]:48s} x{v['items']:<4d} wait {v['wait']} dispatch {v['dispatch']} "
                  f"item {v['item']}" for f, v in list(ip["by_function"].items())[:functions]]
    return lines


def quantized_spec(base, spec: str, g: torch.Generator):
    """``base`` (random bf16 weights) stored as ``spec``: ``bf16``, or ``LAYERS[/HEAD]`` (the
    layers' matrices, and the LM head, a tied model's embedding with it; the head as the layers'
    where not given)."""
    from pto.orchestration.model.quantized import QUANTIZERS, random_quantized, random_quantized_weights

    if spec == "bf16":
        return base
    layers, _, head = spec.partition("/")
    w = random_quantized_weights(base, layers, g)
    head = head or layers
    cfg = base.config
    if head in QUANTIZERS:
        made = QTensor.quantize(head, base.embedding if cfg.tied else base.lm_head.t().contiguous())
    else:
        made = random_quantized(dtype_of(head), cfg.vocab, cfg.hidden, 1.0 if cfg.tied else cfg.hidden ** -0.5, g)
    return replace(w, embedding=made if cfg.tied else w.embedding, lm_head=made)


def file_bytes(w) -> int:
    """Bytes of ``w``'s tensors in a GGUF file of the same types (GGUF's blocks; floats as
    stored), a tied head once: what the resident bytes are held against."""
    from pto.orchestration.model.quantized import is_quantized

    def nbytes(t) -> int:
        if is_quantized(t):
            f = t.dtype.quant
            return f.file_bytes(t.rows, t.cols) if f.gguf else t.nbytes
        return t.numel() * t.element_size()

    heads = [] if w.config.tied else [w.lm_head]
    return sum(nbytes(t) for t in [w.embedding, w.norm, *heads, *(v for x in w.layers for v in x.values())])


def prefill_ms(w, tokens: int, how: str | None = None, repeat: int = 3) -> float:
    """Milliseconds of the prefill of a ``tokens``-token prompt (the layer program, layer by
    layer; quantized weights dequantized on the device a layer at a time or taken as stored, as
    ``how`` says: the Generator's ``quant_prefill``, None: ``$PTO_QUANT_PREFILL``, by default auto),
    the median of ``repeat`` after a first (compiling) one."""
    gen = Generator(w, "cuda", DType.BF16, quant_prefill=how)
    try:
        prompt = torch.randint(0, w.config.vocab, (tokens + 1,), generator=torch.Generator().manual_seed(1)).tolist()
        cap = tokens + 64
        step = gen.step(1, cap)
        times = []
        for _ in range(repeat + 1):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            gen.prefill(step, [prompt], cap)
            torch.cuda.synchronize()
            times.append((time.perf_counter() - t0) * 1e3)
        return round(sorted(times[1:])[repeat // 2], 3)
    finally:
        gen.close()


def quant_runs(tilings: str, qgemv: str | None, quantized: bool) -> list[tuple[str, str]]:
    """(PTO_QGEMV mode, tiling) of each run of a weight spec: ``--tilings`` entries, each
    ``TILING`` (once per ``--qgemv`` mode) or ``MODE:TILING`` (that mode only); a dense spec runs
    each tiling once (no mode; a ``groups:`` entry not at all)."""
    out = []
    for entry in tilings.split(";"):
        mode, _, tiling = entry.rpartition(":") if entry.split(":")[0] in QGEMV_MODES else ("", "", entry)
        if not quantized:
            if mode in ("", "units") and ("", tiling) not in out:
                out.append(("", tiling))
            continue
        for m in [mode] if mode else (qgemv.split(",") if qgemv else [""]):
            out.append((m, tiling))
    return out


def main_quant(args, bw: float) -> int:
    """``--quant``: per configuration, batch and weight spec, our step's ms per token, the floor
    at the spec's bytes, the resident weight bytes (on the GPU and in a file), the prefill."""
    from pto.orchestration.model.quantized import WeightTypes, weight_bytes

    executors = args.executors if args.executors != "persistent,waves" else "waves"
    rows = []
    for name in args.configs.split(","):
        cfg = CONFIGS[name]
        g = torch.Generator(device="cuda").manual_seed(0)
        base = random_weights(cfg, torch.bfloat16, g)
        for spec in args.quant.split(","):
            only, _, spec = spec.rpartition(":")  # (a spec "CONFIG:SPEC" is that configuration's alone)
            if only and only != name:
                continue
            try:
                w = quantized_spec(base, spec, g)
            except UsageError as e:  # a type whose blocks the model's rows are not whole multiples of
                print(json.dumps({"config": name, "quant": spec, "skipped": str(e)}), flush=True)
                continue
            nbytes = weight_bytes(w)
            for batch in (int(b) for b in args.batches.split(",")):
                c = cfg.layer
                kv = cfg.layers * batch * (args.cache // 2) * 2 * c.kv_dim * 2
                floor = round((nbytes["step_read"] + kv) / bw * 1e3, 4)
                row = {"config": name, "quant": spec, "batch": batch, "cache": args.cache,
                       "types": WeightTypes.of(w).to_json(), "floor_ms": floor,
                       "weights_resident_bytes": nbytes["resident"], "weights_file_bytes": file_bytes(w)}
                for mode, tiling in quant_runs(args.tilings, args.qgemv, spec != "bf16"):
                    for ex in executors.split(","):
                        key = (ex if tiling == "default" else f"{ex}[{tiling}]") + (f"/{mode}" if mode else "")
                        if mode:  # the step's backend reads it when the Generator makes it
                            os.environ["PTO_QGEMV"] = mode
                        try:
                            row[key] = ours(w, batch, args.cache, ex, args.steps,
                                            parse_tiling(tiling, tiling_for(cfg), tiling_for_executor(cfg, ex)),
                                            args.kernels, overlap=args.timeline)
                            if "timeline" in row[key]:
                                print_timeline(f"{name} {spec} B={batch} {key}", row[key]["timeline"])
                        except Exception as e:  # report it, measure the rest
                            row[key] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
                        torch.cuda.empty_cache()
                if args.prefill and batch == 1:
                    for how in args.quant_prefill.split(",") if args.quant_prefill else [None]:
                        suffix = f"/{how}" if how else ""
                        try:
                            row["prefill_ms" + suffix] = prefill_ms(w, args.prefill, how)
                        except Exception as e:
                            row["prefill_error" + suffix] = f"{type(e).__name__}: {str(e)[:300]}"
                rows.append(row)
                print(json.dumps(row), flush=True)
            del w
            torch.cuda.empty_cache()
    if args.json:
        write_rows(args.json, bw, rows)
    for r in rows:
        ms = "; ".join(f"{k} {v.get('ms', v.get('error'))} ms" for k, v in r.items() if isinstance(v, dict)
                       and k != "types")
        print(f"{r['config']} {r['quant']} B={r['batch']}: {ms} (floor {r['floor_ms']} ms); weights "
              f"{r['weights_resident_bytes'] / 1e9:.3f} GB resident, {r['weights_file_bytes'] / 1e9:.3f} GB in a file"
              + (f"; prefill {args.prefill} tokens {r['prefill_ms']} ms" if "prefill_ms" in r else ""))
    return 0


def main_tp(args, tp: int) -> int:
    """The tensor-parallel run (module docstring): per configuration and batch, every rank's
    share of the step under each variant and PyTorch's, then rank 0's whole steps; rank 0
    prints and writes ``--json``."""
    rank = dist.init("cuda", tp, command="bench/decode.py")
    bw = copy_bandwidth()
    variants = [(m, h) for h in args.lm_heads.split(",") for m in args.collectives.split(",")]
    rows = []
    for name in args.configs.split(","):
        cfg = CONFIGS[name]
        w = random_weights(cfg, torch.bfloat16, torch.Generator(device="cuda").manual_seed(0))
        for batch in (int(b) for b in args.batches.split(",")):
            row = {"config": name, "batch": batch, "cache": args.cache, "tp": tp,
                   "floor_ms": floor_ms(cfg, batch, args.cache, bw)}
            for mode, head in variants:
                os.environ["PTO_COLLECTIVES"] = mode  # read when the step's collective launches are prepared
                mine = ours(w, batch, args.cache, "waves", args.steps, kernels=args.kernels, tp=tp,
                            vocab_parallel=head == "parallel", comm=True)
                row[f"tp{tp}[{mode},{head}]"] = _slowest(mine, dist.gather(mine))
                torch.cuda.empty_cache()
            mine = torch_tp_step(w, batch, args.cache, args.steps, tp, rank, comm=True)
            row[f"torch_tp{tp}"] = _slowest(mine, dist.gather(mine))
            torch.cuda.empty_cache()
            dist.barrier()
            if rank == 0:
                row["tp1"] = ours(w, batch, args.cache, "waves", args.steps)
                row["torch_tp1"] = torch_tp_step(w, batch, args.cache, args.steps, 1, 0)
                for key in [k for k in row if k.startswith(("tp", "torch_tp")) and k not in ("tp", "tp1", "torch_tp1")]:
                    one = row["torch_tp1" if key.startswith("torch") else "tp1"]["ms"]
                    row[key]["efficiency"] = round(one / (tp * row[key]["ms"]), 3)
                print(json.dumps(row), flush=True)
                torch.cuda.empty_cache()
            dist.barrier()
            rows.append(row)
        del w
        torch.cuda.empty_cache()
    if rank == 0:
        if args.json:
            Path(args.json).write_text(json.dumps({"device": torch.cuda.get_device_name(0), "bandwidth": bw, "tp": tp,
                                                   "nccl_env": {k: os.environ.get(k) for k in (
                                                       "NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST")},
                                                   "collectives": collectives.info(), "rows": rows}, indent=1))
        print(tp_table(rows, tp))
    dist.shutdown()
    return 0


def _slowest(mine: dict, ranks: list[dict]) -> dict:
    """This rank's numbers with the slowest rank's ms, collectives' time and share, the least
    overlap, and every rank's ms."""
    out = {**mine, "ms": max(r["ms"] for r in ranks), "ranks_ms": [r["ms"] for r in ranks]}
    for k, pick in (("comm_ms_per_step", max), ("comm_share", max), ("overlap", min)):
        if k in mine:
            out[k] = pick(r[k] for r in ranks)
    return out


def tp_table(rows: list[dict], tp: int) -> str:
    """Markdown, for docs/PERF.md: per configuration, batch and variant the slowest rank's ms,
    the efficiency against the same code's tp = 1, the collectives' time per step, share and
    overlap, the first run's sums by algorithm."""
    head = ["config", "batch", "variant", "ms", "tp=1 ms", "efficiency", "comm ms/step", "comm share", "overlap",
            "sums"]
    cells = [head, ["---"] * len(head)]
    for r in rows:
        for key, v in r.items():
            if not key.startswith(("tp", "torch_tp")) or key in ("tp", "tp1", "torch_tp1"):
                continue
            one = r["torch_tp1" if key.startswith("torch") else "tp1"]["ms"]
            sums = " ".join(f"{k} {n}" for k, n in sorted(v.get("sums", {}).items())) or "NCCL"
            cells.append([r["config"], str(r["batch"]), key, f"{v['ms']:.3f}", f"{one:.3f}", f"{v['efficiency']:.2f}",
                          f"{v['comm_ms_per_step']:.3f}", f"{v['comm_share']:.1%}", f"{v['overlap']:.1%}", sums])
    return "\n".join("| " + " | ".join(c) + " |" for c in cells)


if __name__ == "__main__":
    sys.exit(main())
