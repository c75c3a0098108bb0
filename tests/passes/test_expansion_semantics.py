"""Binary expansion never changes what a program computes.

Random orchestration programs with adaptive loops and loop-carried regions (recurrences at
several distances and half-tile offsets, loop-invariant accumulators with and without
``reassociate``, in-place updates, disjoint tiles, 2-D regions under a column loop nested either
way, adaptive or not, residual tiles, several tile levels) are lowered by ``expand_binary``.
Either the lowering refuses, and then the program really has two iterations closer than the
merge factor whose regions conflict (found by enumerating the reference tasks, independently of
the symbolic proof), or the expanded program computes bit-exactly what the reference
interpreter computes on the base-tile loops. Data are small integers in f32, so re-associated
sums are exact where a loop says ``reassociate``.
"""

from __future__ import annotations

import random
import re

import torch

from pto import InCore, Orchestration, cdiv, emax, emin, f32, format_module
from pto.backends import get_backend
from pto.errors import BuildError
from pto.exec import get_executor
from pto.interp.orchestration import Specializer, resolve_call, run_program
from pto.ir.expr import evaluate, select
from pto.ir.nodes import If, Let, Loop, Module
from pto.passes.expansion.binary_expansion import expand_binary
from pto.runtime.graph import CompiledProgram

C0 = 2  # column block width
CM = 2 * C0  # column margin (a column shift of up to -2 blocks stays inside)
LEVELS = ({0: 1, 2: 2}, {0: 1, 2: 2, 4: 4}, {0: 1, 4: 2}, {0: 1, 2: 2, 4: 4, 8: 8})  # in base tiles


def _kernels() -> dict:
    """plus1: y = x + 1; twice1: y = 2 y + 1 in place; accum: acc += column sums of x."""
    out = {}
    k = InCore("plus1")
    R, W = k.dim("R", 2), k.dim("W", 2)
    x, y = k.memref("x", f32), k.memref("y", f32)
    t = k.tile("t", R, W, f32)
    k.load(t, x, 0, 0)
    k.adds(t, t, 1.0)
    k.store(y, 0, 0, t)
    out["plus1"] = k.build()
    k = InCore("twice1")
    R, W = k.dim("R", 2), k.dim("W", 2)
    y = k.memref("y", f32)
    t = k.tile("t", R, W, f32)
    k.load(t, y, 0, 0)
    k.muls(t, t, 2.0)
    k.adds(t, t, 1.0)
    k.store(y, 0, 0, t)
    out["twice1"] = k.build()
    k = InCore("accum")
    R, W = k.dim("R", 2), k.dim("W", 2)
    x, acc = k.memref("x", f32), k.memref("acc", f32)
    t, c, a = k.tile("t", R, W, f32), k.tile("c", 1, W, f32), k.tile("a", 1, W, f32)
    k.load(t, x, 0, 0)
    k.colsum(c, t)
    k.load(a, acc, 0, 0)
    k.add(a, a, c)
    k.store(acc, 0, 0, a)
    out["accum"] = k.build()
    return out


KERNELS = _kernels()

# How a moving region's offset and extent follow the loop (b the base height, v the region's
# shift): the affine forms, forms that are not affine as written but equal to an affine one over
# the loop's range, and forms a merged call would get wrong for some sizes.
ROW_FORMS = {
    "affine": lambda i, S, b, v: i * b + v,
    "never_max": lambda i, S, b, v: emax(i * b + v, -3 * b),  # v >= -3b and i >= 0
    "never_min": lambda i, S, b, v: emin(i * b + v, i * b + v + b),
    "clamp": lambda i, S, b, v: emax(emin(i * b + v, S - b), 0),
    "min": lambda i, S, b, v: emin(i * b + v, 2 * b),
    "max": lambda i, S, b, v: emax(i * b + v, 2 * b),
    "floordiv": lambda i, S, b, v: (i // 2) * b + v,
    "select": lambda i, S, b, v: select(i % 2, i * b - b, i * b + b) + v,
}
COL_FORMS = {
    "affine": lambda j, s: j * C0 + s,
    "max": lambda j, s: emax(j * C0 + s, 0),
    "select": lambda j, s: select(j % 2, j * C0 - C0, j * C0 + C0),
}
EXTENTS = {
    "residual": lambda i, S, b: emin(i.rows, S - i * b),
    "end_beyond": lambda i, S, b: emin(S + b - i * b, i.rows),  # the end stays put, past S
    "short": lambda i, S, b: emin(i.rows, 2 * b),  # every merged tile is cut to two base tiles
}
SAFE = {"affine", "never_max", "never_min", "residual", "end_beyond"}


def random_plan(rng: random.Random, forms: bool = False) -> dict:
    """What a program is made of, drawn at random; :func:`build` turns it into a module. With
    ``forms``, moving regions also take offsets and extents of every form above."""
    b = rng.choice((2, 4))
    shape = rng.choice(("1d", "rows_cols", "cols_rows"))
    plan = dict(b=b, levels={p: m * b for p, m in rng.choice(LEVELS).items()}, shape=shape,
                ncb=rng.choice((2, 3)), j_adaptive=shape != "1d" and rng.random() < 0.5, calls=[])
    shifts = (0, 0, 0, -b, -2 * b, -3 * b, b, 2 * b, -(b // 2), b // 2)
    if forms:  # fewer recurrences, so that most refusals come from the forms
        shifts = (0,) * 8 + shifts[3:]
    cshifts = (0, 0, 0, 0, -C0, C0, -(C0 // 2))

    def moving(tensor, reads=False):
        r = dict(tensor=tensor, row=("move", rng.choice(shifts)), csh=rng.choice(cshifts) if shape != "1d" else 0)
        if forms:  # mostly affine; reads take the other forms more often (a write there is often a conflict)
            odd = 0.45 if reads else 0.15
            r.update(form=rng.choice(list(ROW_FORMS)[1:]) if rng.random() < odd else "affine",
                     cform=rng.choice(list(COL_FORMS)[1:]) if rng.random() < odd / 2 else "affine",
                     ext=rng.choice(list(EXTENTS)[1:]) if rng.random() < odd / 2 else "residual")
        return r

    data = ["t0", "t1", "t2"]
    for _ in range(rng.randint(1, 3)):
        kind = rng.choice(("plus1", "plus1", "twice1", "accum"))
        if kind == "plus1":
            x, y = moving(rng.choice(data), reads=True), moving(rng.choice(data))
            if rng.random() < 0.1:
                y["row"] = ("fixed", rng.choice((0, 1)))
            regions = {"x": x, "y": y}
        elif kind == "twice1":
            y = moving(rng.choice(data))
            if rng.random() < 0.1:
                y["row"] = ("fixed", rng.choice((0, 1)))
            regions = {"y": y}
        else:
            regions = {"x": moving(rng.choice(data), reads=True),
                       "acc": dict(tensor="acc", row=("acc", rng.choice((0, 1))), csh=0)}
        plan["calls"].append((kind, regions))
    # reassociate is the author's promise that merged calls equal the calls they replace; these
    # kernels keep it unless a plain write goes to a region that every iteration writes alike
    invariant_writes = any(r["y"]["row"][0] == "fixed" for k, r in plan["calls"] if k != "accum")
    plan["i_reassociate"] = not invariant_writes and rng.random() < 0.5
    plan["j_reassociate"] = plan["j_adaptive"] and rng.random() < 0.5
    return plan


def build(plan: dict) -> Module:
    b, ncb = plan["b"], plan["ncb"]
    marg = 4 * b
    o = Orchestration("rand")
    S = o.scalar("S")
    used = sorted({r["tensor"] for _, regions in plan["calls"] for r in regions.values()})
    cols = 2 * CM + ncb * C0
    T = {n: o.inout(n, 2, cols, f32) if n == "acc" else o.inout(n, S + 2 * marg, cols, f32) for n in used}

    def body(i, j):
        for kind, regions in plan["calls"]:
            binds = {}
            for p, r in regions.items():
                mode, v = r["row"]
                if mode == "move":
                    row = marg + ROW_FORMS[r.get("form", "affine")](i, S, b, v)
                    nrows = EXTENTS[r.get("ext", "residual")](i, S, b)
                elif mode == "fixed":
                    row, nrows = v, b
                else:
                    row, nrows = v, 1
                if j is None:
                    col, ncols = CM, ncb * C0
                else:
                    col = CM + COL_FORMS[r.get("cform", "affine")](j, r["csh"])
                    ncols = j.rows if plan["j_adaptive"] else C0
                binds[p] = (T[r["tensor"]], row, col, nrows, ncols)
            w = ncb * C0 if j is None else (j.rows if plan["j_adaptive"] else C0)
            o.call(KERNELS[kind], binds, dims={"R": i.rows, "W": w})

    i_attrs = dict(tile_levels=plan["levels"], reassociate=plan["i_reassociate"])
    j_attrs = dict(tile_levels={0: C0, 2: 2 * C0}, reassociate=plan["j_reassociate"]) if plan["j_adaptive"] else {}
    if plan["shape"] == "1d":
        with o.for_loop("i", 0, cdiv(S, b), **i_attrs) as i:
            body(i, None)
    elif plan["shape"] == "rows_cols":
        with o.for_loop("i", 0, cdiv(S, b), **i_attrs) as i, o.for_loop("j", 0, ncb, **j_attrs) as j:
            body(i, j)
    else:
        with o.for_loop("j", 0, ncb, **j_attrs) as j, o.for_loop("i", 0, cdiv(S, b), **i_attrs) as i:
            body(i, j)
    return o.module()


def shapes(module: Module, S: int) -> dict[str, tuple[int, int]]:
    return {t.name: (evaluate(t.rows, {"S": S}), evaluate(t.cols, {"S": S})) for t in module.entry_function.tensors}


def inputs(module: Module, S: int, seed: int) -> dict[str, torch.Tensor]:
    """Small integers (every tensor is inout)."""
    g = torch.Generator().manual_seed(seed)
    return {n: torch.randint(-8, 9, shape, generator=g).float() for n, shape in shapes(module, S).items()}


def run(module: Module, S: int, seed: int) -> dict[str, torch.Tensor]:
    return run_program(module, inputs(module, S, seed), {"S": S}).tensors


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[t], b[t]) for t in a)


# -------------------------------------------------------------- the oracle for a refusal


def reference_tasks(module: Module, S: int) -> list:
    """(the loop iterations around it, task) for every task of the base-tile program."""
    fn = module.entry_function
    sizes, spec, out = shapes(module, S), Specializer(module), []

    def walk(body, env, its):
        for s in body:
            if isinstance(s, Let):
                env[s.name] = evaluate(s.value, env)
            elif isinstance(s, If):
                walk(s.then if evaluate(s.cond, env) else s.orelse, env, its)
            elif isinstance(s, Loop):
                if s.adaptive:
                    env[f"{s.var}.rows"] = s.base_rows
                for v in range(evaluate(s.lb, env), evaluate(s.ub, env), evaluate(s.step, env)):
                    walk(s.body, {**env, s.var: v}, its + ((s.var, v),))
            else:
                out.append((its, resolve_call(spec, s, env, sizes)))

    walk(fn.body, {"S": S}, ())
    return out


def conflicts_at(module: Module, S: int, var: str, tensor: str, d: int) -> bool:
    """Two iterations of loop ``var`` that are ``d`` apart (in one instance of the loop)
    touch overlapping parts of ``tensor``, at least one of them writing."""
    tasks = []
    for its, task in reference_tasks(module, S):
        names = [n for n, _ in its]
        if var not in names:
            continue
        k = names.index(var)
        for r in task.regions:
            if r.tensor == tensor:
                tasks.append((its[:k], its[k][1], r))
    for outer, i, r in tasks:
        for outer2, i2, r2 in tasks:
            if outer == outer2 and i2 - i == d and (r.direction != "in" or r2.direction != "in") \
                    and r.row0 < r2.row0 + r2.rows and r2.row0 < r.row0 + r.rows \
                    and r.col0 < r2.col0 + r2.cols and r2.col0 < r.col0 + r.cols:
                return True
    return False


REFUSAL = re.compile(r"adaptive loop `(\w+)`: (?:iterations \w+ and \w+\+(\d+) touch the same region of `(\w+)`"
                     r"|iteration \w+\+(\d+) of call to `\w+` \([^)]*\) \w+ `(\w+)` where)")


def test_random_programs_are_refused_or_computed_bit_exactly():
    rng = random.Random(20260501)
    seen = dict(accepted=0, refused=0, reassociated=0, nested_adaptive=0, recurrence=0, invariant=0,
                unchecked_differs=0, accepted_with_shift=0)
    n_programs = 120
    for p in range(n_programs):
        plan = random_plan(rng)
        m = build(plan)
        b = plan["b"]
        sizes = (rng.randint(2 * b, 6 * b), rng.randint(6 * b + 1, 12 * b))
        try:
            lowered = expand_binary(m)
        except BuildError as err:
            msg = str(err)
            got = REFUSAL.search(msg)
            assert got, msg
            var = got.group(1)
            d = int(got.group(2) or got.group(4))
            tensor = got.group(3) or got.group(5)
            if got.group(3):  # a loop-invariant region is refused only without the opt-in
                seen["invariant"] += 1
                assert not plan[f"{var}_reassociate"], msg
            else:
                seen["recurrence"] += 1
            assert any(conflicts_at(m, S, var, tensor, d) for S in sizes), \
                f"program {p} refused but iterations {d} apart of `{var}` never conflict on `{tensor}`: {msg}"
            seen["refused"] += 1
            if not _same(run(expand_binary(m, check=False), sizes[1], p), run(m, sizes[1], p)):
                seen["unchecked_differs"] += 1  # what the merge would have computed instead
            continue
        seen["accepted"] += 1
        seen["reassociated"] += plan["i_reassociate"] and any(k == "accum" for k, _ in plan["calls"])
        seen["nested_adaptive"] += plan["j_adaptive"]
        seen["accepted_with_shift"] += any(r["row"] != ("move", 0) for _, rs in plan["calls"] for r in rs.values()
                                           if r["row"][0] == "move")
        for S in sizes:
            assert _same(run(lowered, S, p), run(m, S, p)), \
                f"program {p}, S={S}: the expansion differs\n{format_module(m)}"
    # the generator reaches every case the check distinguishes, and merges that would have
    # computed something else are among the refusals
    assert seen["accepted"] >= 40 and seen["refused"] >= 40, seen
    assert min(seen["reassociated"], seen["nested_adaptive"], seen["recurrence"], seen["invariant"],
               seen["accepted_with_shift"]) >= 5, seen
    assert seen["unchecked_differs"] >= 20, seen


def test_accepted_random_programs_run_as_graphs_bit_exactly():
    """The default pipeline (generated C, the runtime's dependencies, the executor in a random
    ready order) on accepted programs with a nested adaptive loop and a re-associated
    accumulator computes what the reference interpreter computes."""
    rng = random.Random(7)
    wanted = {"nested": lambda p: p["j_adaptive"],
              "reassociated": lambda p: p["i_reassociate"] and any(k == "accum" for k, _ in p["calls"])}
    found = {}
    while len(found) < len(wanted):
        plan = random_plan(rng)
        key = next((k for k, ok in wanted.items() if k not in found and ok(plan)), None)
        if key is None:
            continue
        try:
            expand_binary(build(plan))
        except BuildError:
            continue
        found[key] = plan
    for key, plan in found.items():
        m = build(plan)
        cp = CompiledProgram.get(m)
        for seed, S in enumerate((5 * plan["b"] + 1, 11 * plan["b"])):
            want = run(m, S, seed)
            g = cp.build_graph({"S": S})
            tensors = inputs(m, S, seed)
            get_executor("waves", get_backend("torch", "cpu"), tensors, order="random", seed=seed).run(g)
            g.close()
            for t in want:
                assert torch.equal(tensors[t], want[t]), f"{key} program, S={S}: `{t}` differs"
