"""Fusion never changes a result (issue 42): random small f32 programs (:mod:`tests.passes.fusion_programs`:
carried-region chains, producer-consumer pairs and their near misses, empty and negative trip
counts, residual tiles, several tile heights, adaptive and re-associating loops), each fused with
and without merged steps, run as fused and after binary expansion, against the reference
interpreter on the written program at three sets of scalars (:func:`tests.passes.fusion_check.check_fusion`:
bit-exact, or within 1e-5 of the largest value where a loop re-associates and iterations were
merged), or refused with a reason. A failure names the seeds and prints the first program's text
form; ``python -m tests.passes.fusion_programs SEED`` reproduces one.
"""

from __future__ import annotations

from collections import Counter

import pytest

from pto.ir.nodes import If
from tests.passes.fusion_check import Mismatch, check_fusion
from tests.passes.fusion_programs import generate


def _sweep(seeds) -> Counter:
    """Check every seed's program; fail with all failing seeds and the first one's story.
    Returns what the programs exercised."""
    seen: Counter = Counter()
    failures: list[tuple[int, str]] = []
    for seed in seeds:
        p = generate(seed)
        try:
            out = check_fusion(p.module, list(p.scalars), seed=seed, what=f"seed {seed}: ")
        except Mismatch as e:
            failures.append((seed, str(e)))
            continue
        seen["programs"] += 1
        seen["runs"] += out.runs
        seen["invalid scalar sets"] += out.invalid
        seen["fused"] += out.fused
        merged = out.reports[True].fused
        loops = [f.loop for f in merged if f.kind == "chain"]
        seen["merged steps"] += len(loops) != len(set(loops))  # a loop fused as merged steps and remainder
        seen["guarded by the trip count"] += any(isinstance(s, If) for m in out.modules.values()
                                                 for s in m.entry_function.body)
        for r in out.refused:
            seen["refused merged steps"] += r.startswith("merged steps")
            seen["refused in a loop expansion cannot merge"] += r.startswith("binary expansion cannot merge")
        seen["expansion refused"] += len(out.expansion_refused)
    if failures:
        pytest.fail(f"fusion changed the result of {len(failures)} programs (seeds {[s for s, _ in failures]}; "
                    f"`python -m tests.passes.fusion_programs SEED` shows one):\n{failures[0][1]}", pytrace=False)
    return seen


def _exercised(seen: Counter, scale: int) -> None:
    """Neither half is vacuous: fusions happen and are refused, every new rule fires."""
    assert seen["runs"] >= 2 * scale and seen["fused"] >= 2 * scale, seen
    for what in ("merged steps", "guarded by the trip count", "refused merged steps",
                 "refused in a loop expansion cannot merge", "expansion refused"):
        assert seen[what] >= scale // 50, (what, seen)


def test_fusion_keeps_the_result_of_200_random_programs():
    _exercised(_sweep(range(200)), 200)


@pytest.mark.slow
@pytest.mark.parametrize("first", range(1000, 6000, 500))
def test_fusion_keeps_the_result_of_5000_random_programs(first):
    """Seeds 1000 to 5999, in ten parts of 500 (each well within a test's time limit)."""
    _exercised(_sweep(range(first, first + 500)), 500)


@pytest.mark.parametrize("seq,tasks", [(9, 1), pytest.param(12, 2, marks=pytest.mark.slow)])
def test_pto_graph_json_names_the_reasons_of_the_new_rules(tmp_path, seq, tasks):
    """Through the command line, a program registered by an entry point (as a plugin is): the
    chain that may not step over merged tiles is one task over base tiles, the chain whose state
    row lies in its tensor only where its loop has a trip runs only then (no task at 9 rows: its
    loop has none), and ``refused`` says which rule, for which loop and call."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    info = tmp_path / "fusecases-0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fusecases\nVersion: 0\n")
    (info / "entry_points.txt").write_text("[pto.programs]\nfusecases = tests.passes.fusion_cli_program:PROGRAM\n")
    root = Path(__file__).resolve().parents[2]
    path = os.pathsep.join([str(tmp_path), str(root), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))
                            ])
    r = subprocess.run([sys.executable, "-m", "pto.cli", "graph", "fusecases", "--seq", str(seq), "--json"],
                       capture_output=True, text=True, timeout=300, cwd=root, env={**os.environ, "PYTHONPATH": path})
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["tasks"] == tasks and [(f["kind"], f["loop"]) for f in out["fused"]] == [("chain", "j"), ("chain", "k")]
    merge, guard = out["refused"]
    assert (merge["kind"], merge["loop"], merge["calls"]) == ("chain", "j", ["colsum_acc"]), merge
    assert merge["reason"].startswith("merged steps (the chain steps over base tiles): call to `colsum_acc`"), merge
    assert "reads `x` at row offset `j * 4`, which is not `j * 2`" in merge["reason"], merge
    assert (guard["kind"], guard["loop"], guard["calls"]) == ("guard", "k", ["colsum_acc"]), guard
    assert guard["reason"].startswith("`if S - 9 > 0`, as `late` at row offset `S - 10` with rows `1` is not "
                                      "shown to lie in its tensor when the loop has no trip"), guard
