"""Reference interpreter of orchestration functions: walks the program in order, resolves each
call to a task (callee variant, regions with directions, scalar arguments) and runs it at once.

:func:`iter_tasks` is the single Python definition of "what task does this call submit"; the
interpreter, the Python-side graph checks and the tests use it, and the generated C must agree
with it (tests compare them).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace

import torch

from pto.data.buffers import allocate, tensor_shapes
from pto.errors import BuildError, ExecutionError, RegionError
from pto.interp.incore import run_incore
from pto.ir.analysis import param_access, specialize
from pto.ir.expr import evaluate
from pto.ir.nodes import Call, If, IncoreFunction, Let, Loop, Module, RegionBinding


@dataclass(frozen=True)
class TaskRegion:
    param: str
    tensor: str
    direction: str  # in | out | inout
    row0: int
    col0: int
    rows: int
    cols: int


@dataclass(frozen=True)
class TaskSpec:
    """One task: the specialized callee, its regions (in parameter order) and scalar args;
    ``loops``: the values of the names :func:`iter_tasks` tracks at the call (by default the
    enclosing loop variables, outermost first)."""

    func: IncoreFunction
    regions: tuple[TaskRegion, ...]
    scalars: tuple[tuple[str, int], ...]
    call: Call
    loops: tuple[tuple[str, int], ...] = ()


class Specializer:
    """Caches callee variants and their parameter accesses."""

    def __init__(self, module: Module):
        self.module = module
        self._cache: dict[tuple, tuple[IncoreFunction, dict]] = {}

    def get(self, name: str, dims: dict[str, int]) -> tuple[IncoreFunction, dict]:
        key = (name, tuple(sorted(dims.items())))
        hit = self._cache.get(key)
        if hit is None:
            f = self.module.get(name)
            if not isinstance(f, IncoreFunction):
                raise BuildError(f"call to unknown InCore function `{name}`")
            spec = specialize(f, dims)
            hit = (spec, param_access(spec))
            self._cache[key] = hit
        return hit


def resolve_call(spec: Specializer, call: Call, env: dict, shapes: dict[str, tuple[int, int]]) -> TaskSpec:
    """The task a call submits under the scalar environment ``env`` (checks its regions)."""
    where = f"call to `{call.func}`" + (f" ({call.loc})" if call.loc else "")
    try:
        dims = {k: int(evaluate(e, env)) for k, e in call.dims}
    except BuildError as err:
        raise ExecutionError(f"{where}: {err}") from None
    for k, v in dims.items():
        if v <= 0:
            raise RegionError(f"{where}: dim `{k}` evaluates to {v}")
    func, access = spec.get(call.func, dims)
    scalars = []
    for k, v in call.args:
        if not isinstance(v, RegionBinding):
            scalars.append((k, int(evaluate(v, env))))
    callee_env = dict(scalars)
    regions = []
    for k, v in call.args:
        if not isinstance(v, RegionBinding):
            continue
        acc = access[k]
        full_r, full_c = int(evaluate(acc.rows, callee_env)), int(evaluate(acc.cols, callee_env))
        r0, c0 = int(evaluate(v.row, env)), int(evaluate(v.col, env))
        nr = full_r if v.rows is None else int(evaluate(v.rows, env))
        nc = full_c if v.cols is None else int(evaluate(v.cols, env))
        if nr <= 0 or nc <= 0:
            raise RegionError(f"{where}: region of `{k}` on tensor `{v.tensor}` is empty "
                              f"({nr}x{nc} at row {r0}, col {c0})")
        if nr > full_r or nc > full_c:
            raise RegionError(f"{where}: region of `{k}` is {nr}x{nc} but `{call.func}` accesses "
                              f"only {full_r}x{full_c} of it")
        tr, tc = shapes[v.tensor]
        if r0 < 0 or c0 < 0 or r0 + nr > tr or c0 + nc > tc:
            raise RegionError(f"{where}: region of `{k}` rows [{r0}, {r0 + nr}) x cols [{c0}, {c0 + nc}) "
                              f"lies outside tensor `{v.tensor}` ({tr}x{tc})")
        regions.append(TaskRegion(k, v.tensor, acc.direction, r0, c0, nr, nc))
    return TaskSpec(func, tuple(regions), tuple(scalars), call)


def iter_tasks(module: Module, scalars: dict[str, int], spec: Specializer | None = None,
               track: tuple[str, ...] | None = None) -> Iterator[TaskSpec]:
    """The tasks of the entry orchestration function, in program order (task ``k`` is the
    ``k``-th task the generated C submits). Each carries the values of the names in ``track``
    that are defined at its call (default: the enclosing loop variables), as ``loops``."""
    fn = module.entry_function
    shapes = tensor_shapes(fn, scalars)
    spec = spec or Specializer(module)
    env = {k: int(v) for k, v in scalars.items()}
    for call, (loops, at) in _walk(fn.body, env, (), track):
        yield replace(resolve_call(spec, call, at, shapes), loops=loops)


def call_sites(module: Module, scalars: dict[str, int], wanted, track: tuple[str, ...] | None = None
               ) -> dict[int, tuple[Call, tuple[tuple[str, int], ...]]]:
    """The call that submits each task index in ``wanted`` and the tracked values there (as
    :func:`iter_tasks`'s ``loops``), without resolving any call: a walk of the loops and lets
    only, so finding one task of a large graph is cheap."""
    want = set(int(k) for k in wanted)
    out = {}
    if not want:
        return out
    last = max(want)
    env = {k: int(v) for k, v in scalars.items()}
    for k, (call, (loops, _)) in enumerate(_walk(module.entry_function.body, env, (), track)):
        if k in want:
            out[k] = (call, loops)
        if k >= last:
            break
    return out


def _walk(body, env, scope, track):
    """(call, (tracked values, environment)) for every call in program order; ``scope``: the
    enclosing loop variables."""
    for s in body:
        if isinstance(s, Let):
            env[s.name] = int(evaluate(s.value, env))
        elif isinstance(s, Call):
            names = scope if track is None else track
            yield s, (tuple((n, env[n]) for n in names if n in env), env)
        elif isinstance(s, Loop):
            lb, ub, st = (int(evaluate(e, env)) for e in (s.lb, s.ub, s.step))
            if st <= 0:
                raise ExecutionError(f"loop `{s.var}` has step {st}")
            if s.adaptive:
                env[f"{s.var}.rows"] = s.base_rows
            for v in range(lb, ub, st):
                env[s.var] = v
                yield from _walk(s.body, dict(env), (*scope, s.var), track)
        elif isinstance(s, If):
            branch = s.then if evaluate(s.cond, env) else s.orelse
            yield from _walk(branch, env, scope, track)
        else:  # pragma: no cover
            raise TypeError(s)


@dataclass
class RunResult:
    tensors: dict[str, torch.Tensor]
    tasks: int


def run_task(task: TaskSpec, tensors: dict[str, torch.Tensor]) -> None:
    regions = {r.param: (tensors[r.tensor], r.row0, r.col0, r.rows, r.cols) for r in task.regions}
    run_incore(task.func, regions, dict(task.scalars))


def run_program(module: Module, inputs: dict[str, torch.Tensor], scalars: dict[str, int],
                device=None) -> RunResult:
    """Run the entry orchestration function in program order with the reference interpreter."""
    fn = module.entry_function
    shapes = tensor_shapes(fn, scalars)
    if device is None:
        device = next(iter(inputs.values())).device if inputs else torch.device("cpu")
    tensors = allocate(fn, shapes, inputs, device)
    n = 0
    for task in iter_tasks(module, scalars):
        run_task(task, tensors)
        n += 1
    return RunResult(tensors, n)
