"""Benchmark of the CPU path's cost per task: the wave executor with the torch backend.

    python bench/cpu_tasks.py [--runs 5] [--json]

For each case, ``pto run`` on the CPU (torch backend, waves executor, f32, tiny config) through
the engine, ``--runs`` times in one process (each run builds a fresh runner, as the command
does); the table gives the medians of

- ``exec_ms``: the execution of the built graph (what ``pto run --json`` reports), and
  ``tasks_per_s`` = tasks / exec_ms;
- ``build_ms`` (the C runtime's graph build) and ``compile_ms`` (specializing the InCore
  functions), which are not part of the execution;
- for softmax, ``eager_ms``: ``torch.softmax`` of the same tensor in the same process (median of
  21 calls) with torch's default intra-op threads, ``eager_1t_ms`` with one, and the ratio
  ``exec_ms / eager_ms``.

Times are wall-clock on the host; on a shared machine compare runs made in the same session.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run from a source checkout without installing
    sys.path.insert(0, str(ROOT))

from pto import programs  # noqa: E402
from pto.cli.commands.run import run  # noqa: E402
from pto.exec.timing import median_ms  # noqa: E402

#: (label, program, seq, program options)
CASES = [
    ("llama7b split, seq 1000", "llama7b", 1000, {"attention": "split"}),
    ("llama7b fused, seq 1000", "llama7b", 1000, {}),
    ("softmax, seq 1000", "softmax", 1000, {}),
    ("softmax, seq 4096", "softmax", 4096, {}),
]


def measure(program: str, seq: int, options: dict, runs: int) -> dict:
    """Medians of ``runs`` runs of one case (fresh runner each)."""
    results = [run(program, seq, device="cpu", backend="torch", executor="waves", **options)
               for _ in range(runs)]
    med = {k: statistics.median(r[k] for r in results) for k in ("exec_ms", "build_ms", "compile_ms")}
    out = {"tasks": results[0]["tasks"], "launches": results[0]["launches"], "waves": results[0]["waves"],
           **{k: round(v, 3) for k, v in med.items()},
           "exec_ms_min": round(min(r["exec_ms"] for r in results), 3),
           "tasks_per_s": round(results[0]["tasks"] / med["exec_ms"] * 1e3, 1)}
    if program == "softmax":
        out.update(eager(seq))
        out["vs_eager"] = round(med["exec_ms"] / out["eager_ms"], 1)
    return out


def eager(seq: int) -> dict:
    """``torch.softmax`` of a tiny softmax input: median ms with the default threads and with one."""
    x = torch.randn(seq, programs.get("softmax").configs["tiny"]) * 3.0
    out = {"eager_ms": round(median_ms(lambda: torch.softmax(x, dim=-1), 21, warmup=2, cuda=False), 3)}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        out["eager_1t_ms"] = round(median_ms(lambda: torch.softmax(x, dim=-1), 21, warmup=2, cuda=False), 3)
    finally:
        torch.set_num_threads(threads)
    return out


def table(rows: list[tuple[str, dict]]) -> str:
    head = ("case", "tasks", "launches", "exec_ms", "tasks_per_s", "build_ms", "compile_ms", "eager_ms",
            "eager_1t_ms", "vs_eager")
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for label, r in rows:
        cells = [label] + [str(r.get(k, "")) for k in head[1:]]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5, help="engine runs per case (median; default 5)")
    ap.add_argument("--case", action="append", help="only the cases whose label contains this text")
    ap.add_argument("--json", action="store_true", help="one JSON object on stdout instead of the table")
    a = ap.parse_args(argv)
    cases = [c for c in CASES if not a.case or any(s in c[0] for s in a.case)]
    rows = [(label, measure(prog, seq, opts, a.runs)) for label, prog, seq, opts in cases]
    meta = {"machine": platform.processor() or platform.machine(), "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(), "runs": a.runs}
    if a.json:
        print(json.dumps({**meta, "results": {label: r for label, r in rows}}))
    else:
        print(table(rows))
        print(f"\n{meta}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
