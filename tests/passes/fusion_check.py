"""The check every fusion test makes: the fused module computes what the written module computes.

:func:`check_fusion` fuses a module with and without merged steps, runs each fused module as it
is and after binary expansion, and compares each run with the reference interpreter's run of
the written module (:func:`pto.interp.orchestration.run_program`, base tiles) on seeded random
inputs, for every set of scalars given: the program's inputs, in-outs and outputs must agree
bit-exactly, or within 1e-5 of the tensor's largest value where a loop says ``reassociate``
and the run merged iterations (merged steps or expansion). A fusion the pass refuses needs a
reason; an expansion refused (a BuildError naming the loop) is a refusal too. Data are uniform
in [0, 1): positive, so a re-associated sum of n terms is within n ulps of the written one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from pto import format_module
from pto.errors import BuildError, PTOError
from pto.interp.orchestration import run_program
from pto.ir.expr import evaluate
from pto.ir.nodes import If, Loop, Module
from pto.ir.verify import verify_module
from pto.passes.binary_expansion import expand_binary
from pto.passes.fusion import FusionReport, fuse

REL = 1e-5  # f32 re-association of sums of at most a few hundred positive terms


@dataclass
class Outcome:
    """What one module's check saw: fusions made and refused (the pass's reasons; a fused module
    binary expansion refuses, its message), and the scalar sets the written program itself rejects
    (not compared)."""

    fused: int = 0
    refused: list[str] = field(default_factory=list)
    expansion_refused: list[str] = field(default_factory=list)
    runs: int = 0
    invalid: int = 0
    reports: dict = field(default_factory=dict)  # merge -> FusionReport
    modules: dict = field(default_factory=dict)  # merge -> the fused module


class Mismatch(AssertionError):
    pass


def reassociates(module: Module) -> bool:
    def visit(body) -> bool:
        for s in body:
            if isinstance(s, Loop) and (s.reassociate or visit(s.body)):
                return True
            if isinstance(s, If) and (visit(s.then) or visit(s.orelse)):
                return True
        return False

    return any(visit(f.body) for f in module.orchestration_functions)


def inputs(module: Module, scalars: dict, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {t.name: torch.rand(int(evaluate(t.rows, scalars)), int(evaluate(t.cols, scalars)), generator=g)
            for t in module.entry_function.tensors if t.role in ("input", "inout")}


def _compare(module: Module, want: dict, got: dict, exact: bool) -> str | None:
    """The first tensor that differs, described; None when they agree."""
    for t in module.entry_function.tensors:
        if t.role == "temp":
            continue  # not a result: fusion may keep it on chip or drop it
        a, b = want[t.name], got[t.name]
        if not torch.equal(a.isnan(), b.isnan()):
            return f"`{t.name}`: written elements differ ({int(a.isnan().sum())} vs {int(b.isnan().sum())} unwritten)"
        a, b = a.nan_to_num(), b.nan_to_num()
        err = (a - b).abs().max().item() if a.numel() else 0.0
        bound = 0.0 if exact else REL * max(a.abs().max().item(), 1e-30)
        if err > bound:
            return f"`{t.name}`: max difference {err:g} (allowed {bound:g})"
    return None


def check_fusion(module: Module, scalar_sets: list[dict], seed: int = 0, merges=(False, True),
                 expands=(False, True), what: str = "") -> Outcome:
    """Raise :class:`Mismatch` (with the program's text form) unless every fused variant of
    ``module`` computes what the written module computes (the module docstring)."""
    out = Outcome()
    loose = reassociates(module)
    cases = []
    for sc in scalar_sets:
        x = inputs(module, sc, seed)
        try:
            want = run_program(module, {k: v.clone() for k, v in x.items()}, sc).tensors
        except PTOError:
            out.invalid += 1
            continue
        cases.append((sc, x, want))

    def fail(msg: str, fm: Module | None = None) -> None:
        text = format_module(module)
        fused = f"\n--- fused ---\n{format_module(fm)}" if fm is not None and fm is not module else ""
        raise Mismatch(f"{what}{msg}\n--- written ---\n{text}{fused}")

    checked: list[Module] = [module]  # a variant equal to one already run needs no run (the written one: its own)
    for merge in merges:
        fm, rep = fuse(module, merge=merge)
        out.reports[merge], out.modules[merge] = rep, fm
        out.fused += len(rep.fused)
        for r in rep.refused:
            if not r.reason:
                fail(f"merge={merge}: a refusal without a reason: {r}")
            out.refused.append(r.reason)
        try:
            verify_module(fm)
        except BuildError as e:
            fail(f"merge={merge}: the fused module does not verify: {e}", fm)
        for expand in expands:
            run = fm
            if expand:
                try:
                    run = expand_binary(fm)
                except BuildError as e:
                    out.expansion_refused.append(str(e))
                    continue
            if any(run == m for m in checked) or fm is module:  # (the written program, expanded: not fusion's)
                continue
            checked.append(run)
            for sc, x, want in cases:
                where = f"merge={merge} expand={expand} scalars={sc}: "
                try:
                    got = run_program(run, {k: v.clone() for k, v in x.items()}, sc).tensors
                except PTOError as e:
                    fail(f"{where}the fused program fails where the written one runs: {e}", fm)
                bad = _compare(module, want, got, exact=not (loose and (merge or expand)))
                if bad:
                    fail(f"{where}{bad}\n{_describe(rep)}", fm)
                out.runs += 1
    return out


def _describe(rep: FusionReport) -> str:
    return "\n".join(rep.describe())


__all__ = ["Mismatch", "Outcome", "check_fusion", "inputs", "reassociates"]
