"""Dependencies at the granularity of data (``PTO_MK_DEPS=data``, :mod:`pto.exec.item_deps`): an
item waits only for the predecessor items whose data its own conflicts with. Checked against the
decode step's layout (a RoPE item of one head waits for the projection items of that head's q, k
and v columns), as a subset of the task-level waits with counts that add up, and end to end under
the Triton interpreter: the megakernel run in an order that only the data dependencies allow
(consumers as early as they may be, ahead of items of their tasks' predecessors) gives the wave
executor's results bit for bit, on graphs whose items overlap in different ways."""

from __future__ import annotations

import heapq
import os

import numpy as np
import pytest
import torch

from pto.errors import UsageError
from pto.exec.item_deps import MAX_FANOUT, resolve_deps


def _decode_plan(config: str, deps: str):
    from pto.orchestration.model.decode import build_step
    from pto.orchestration.model.program import CONFIGS, tiling_for_executor

    from pto.backends.triton import TritonBackend
    from pto.engine import build_module_graph
    from pto.exec.plan import make_plan
    from pto.ir.dtypes import DType
    from pto.machine.target import get

    cfg = CONFIGS[config]
    tiles = tiling_for_executor(cfg, "persistent", get("cuda_h200"))
    built = build_module_graph(build_step(cfg, DType.BF16, get("cuda_h200"), 1, tiles, cache=1024),
                               {"B": 1, "C": 1024})
    try:
        plan = make_plan(built.graph, list(built.graph.tensor_ids), {}, flags=TritonBackend("cpu").task_flags,
                         runs=264, deps=deps)
    finally:
        built.graph.close()
    return cfg, tiles, plan


def item_predecessors(plan, counters) -> list[set[int]]:
    """Per queue index, the queue indices of the items it waits for (the items whose release row
    holds its counter)."""
    pos = {}
    for i, (t, k) in enumerate(plan.items.tolist()):
        pos[(t, k)] = i
    waiting: dict[int, list[int]] = {}
    for i, c in enumerate(counters.counter.tolist()):
        waiting.setdefault(c, []).append(i)
    preds = [set() for _ in range(plan.n_items)]
    for j in range(plan.n_items):
        r = counters.row[j]
        for c in counters.rel[counters.rel_ptr[r]:counters.rel_ptr[r + 1]].tolist():
            for i in waiting.get(c, []):
                preds[i].add(j)
    return preds


def test_a_rope_item_waits_for_the_projection_items_of_its_heads_columns():
    """The 1B shape's step: each RoPE item (query head h, which also appends key/value head h
    where there is one) waits, of its layer's q/k/v projection, for exactly the items whose
    outputs meet head h's q columns and, for h below the key/value heads, its k and v columns
    (the projection's items of ``qkv_bn`` outputs, ``run`` indices each); every item's waits
    are a subset of its task's predecessors' items; each counter's count is the number of items
    that release it."""
    cfg, tiles, plan = _decode_plan("llama3.2-1b", "data")
    c = plan.counters()
    preds = item_predecessors(plan, c)
    assert all(len(p) == c.init[c.counter[i]] for i, p in enumerate(preds))
    task = plan.items[:, 0]
    pred_tasks = [set(plan.edge_sources[plan.succ == t].tolist()) for t in range(plan.n_tasks)]
    assert all(set(task[list(p)].tolist()) <= pred_tasks[task[i]] for i, p in enumerate(preds))
    d = cfg.layer.head_dim
    q_dim, kv_dim = cfg.layer.heads * d, cfg.layer.kv_heads * d
    rope = [t for t in range(plan.n_tasks) if plan.variants[t].name == "rope_qkv_append"]
    assert len(rope) == cfg.layers
    checked = 0
    for t in rope:
        (qkv,) = [p for p in pred_tasks[t] if plan.variants[p].name == "gemv_norm_tile"]
        first, count = plan.item_indices(plan.items)
        for i in np.flatnonzero(task == t):
            h = int(first[i])
            cols = [(h * d, (h + 1) * d)]
            if h < cfg.layer.kv_heads:  # (item h appends key/value head h: each once)
                cols += [(q_dim + h * d, q_dim + (h + 1) * d), (q_dim + kv_dim + h * d, q_dim + kv_dim + (h + 1) * d)]
            want = {j for j in np.flatnonzero(task == qkv)
                    if any(first[j] * tiles.qkv_bn < b and a < (first[j] + count[j]) * tiles.qkv_bn for a, b in cols)}
            got = {j for j in preds[i] if task[j] == qkv}
            assert got == want and 0 < len(want) < plan.nitems[qkv], (t, h)
            checked += 1
    assert checked == cfg.layers * cfg.layer.heads


def test_data_dependencies_are_the_default_and_the_setting_is_checked(monkeypatch):
    """``data`` is the default; ``task``: a counter a task, its predecessors' items; a wrong
    value of ``PTO_MK_DEPS`` is one line."""
    _, _, plan = _decode_plan("smollm2-135m", "task")
    c = plan.counters()
    assert plan.boxes is None and np.array_equal(c.counter, plan.items[:, 0])
    assert np.array_equal(c.init, plan.pending_items)
    monkeypatch.delenv("PTO_MK_DEPS", raising=False)
    assert resolve_deps(None) == "data" and resolve_deps("task") == "task"
    monkeypatch.setenv("PTO_MK_DEPS", "fine")
    with pytest.raises(UsageError, match=r"^PTO_MK_DEPS='fine': the megakernel's dependencies are task or data$"):
        resolve_deps(None)


def test_fewer_waits_and_releases_with_data_dependencies():
    """SmolLM2's step: its attention parts wait for the projection items of their own heads
    (fewer than half the items they wait for at the task's granularity), no item waits for more
    than it did, and the whole step's releases fall."""
    _, _, task = _decode_plan("smollm2-135m", "task")
    _, _, data = _decode_plan("smollm2-135m", "data")
    ct, cd = task.counters(), data.counters()
    assert np.array_equal(task.items, data.items)
    parts = np.array([data.variants[t].name == "decode_attn_part" for t in data.items[:, 0]])
    assert cd.init[cd.counter[parts]].mean() < 0.5 * ct.init[ct.counter[parts]].mean()
    released = [int(np.diff(c.rel_ptr)[c.row].sum()) for c in (ct, cd)]  # (the atomics a launch executes)
    assert released[1] < released[0]
    assert (cd.init[cd.counter] <= ct.init[ct.counter]).all()


@pytest.mark.parametrize("n", [4, 16])
def test_a_prefix_read_keeps_one_counter_past_the_fanout_bound(n):
    """``write`` (n items) stores X's row h; ``prefix`` (n items) reads rows 0..h for its item h,
    a causal pattern: item h waits for h + 1 writes, and write item r feeds the n - r counters
    of the items from r on. Within MAX_FANOUT decrements a predecessor item on average (n = 4:
    10 of 16) each item keeps its own counter; past it (n = 16: 136 of 64) the task takes one
    counter for all n writes, as at the task's granularity."""
    from pto import InCore, Orchestration, f32
    from pto.backends.triton import TritonBackend
    from pto.engine import build_module_graph
    from pto.exec.plan import make_plan

    def kernel(name, prefix):
        k = InCore(name)
        src, dst = k.memref("src", f32), k.memref("dst", f32)
        h = k.parallel("h", n)
        t = k.tile("t", 1, 8, f32)
        if prefix:
            with k.for_range("r", 0, h + 1) as r:
                k.load(t, src, r, 0)
        else:
            k.load(t, src, h, 0)
        k.store(dst, h, 0, t)
        return k.build()

    o = Orchestration("prefix_graph")
    i, x, y = o.input("I", n, 8, f32), o.temp("X", n, 8, f32), o.output("Y", n, 8, f32)
    o.call(kernel("write", False), {"src": i, "dst": x})
    o.call(kernel("prefix", True), {"src": x, "dst": y})
    graph = build_module_graph(o.module(), {}).graph
    try:
        plan = make_plan(graph, list(graph.tensor_ids), {}, flags=TritonBackend("cpu").task_flags, deps="data")
    finally:
        graph.close()
    c = plan.counters()
    reader = plan.items[:, 0] == [f.name for f in plan.variants].index("prefix")
    waits = c.init[c.counter[reader]]
    h = plan.items[reader, 1]
    assert n * (n + 1) // 2 > MAX_FANOUT * n if n == 16 else n * (n + 1) // 2 <= MAX_FANOUT * n
    if n == 4:
        assert np.array_equal(waits, h + 1) and len(set(c.counter[reader].tolist())) == n
    else:
        assert (waits == n).all() and len(set(c.counter[reader].tolist())) == 1


def _adversarial_order(plan, counters, rng: np.random.Generator | None = None) -> np.ndarray:
    """A topological order of the items under their data dependencies that takes, of the items
    ready, the one latest in the queue (consumers as soon as they may run), or with ``rng`` a
    random one."""
    preds = item_predecessors(plan, counters)
    succs = [[] for _ in range(plan.n_items)]
    for i, p in enumerate(preds):
        for j in p:
            succs[j].append(i)
    left = np.array([len(p) for p in preds])
    ready = [-i for i in range(plan.n_items) if left[i] == 0]
    heapq.heapify(ready)
    out = []
    while ready:
        j = -(heapq.heappop(ready) if rng is None else ready.pop(int(rng.integers(len(ready)))))
        out.append(j)
        for i in succs[j]:
            left[i] -= 1
            if left[i] == 0:
                if rng is None:
                    heapq.heappush(ready, -i)
                else:
                    ready.append(-i)
    assert len(out) == plan.n_items
    return np.array(out)


def _run_in_order(ex, kernel, order: np.ndarray, inputs: dict, want: dict) -> None:
    """The persistent executor's kernel's plan run in ``order`` on ``inputs``: no wait gives up
    and the outputs are ``want``, bit for bit."""
    reordered = ex.backend.megakernel(kernel.plan.reordered(order), ex.tensors, kernel.settings)
    for name, value in inputs.items():
        ex.tensors[name].copy_(value)
    reordered.launch()
    assert reordered.gave_up() is None
    for k in want:
        assert torch.equal(ex.tensors[k], want[k]), k


def run_program(program: str, executor: str, seq, options: dict | None, shape: dict | None):
    """``program`` (the model program's ``config`` among ``options``, in f32) on the CPU's Triton
    backend and ``executor`` at ``shape`` or ``seq``, on seeded inputs: its runner, the inputs
    and every output (copied)."""
    from pto.engine import Runner, resolve

    options = dict(options or {})
    config = options.pop("config", None)
    job = resolve(program, executor=executor, device="cpu", backend="triton", options=options or None,
                  **({"config": config} if config else {}), **({"dtype": "f32"} if program == "model" else {}))
    at = shape if shape is not None else seq
    runner = Runner(job, at)
    inputs = job.program.inputs(job.settings, job.program.shape(at), "cpu", seed=3)
    return runner, inputs, {k: v.clone() for k, v in runner(inputs).items()}


def persistent_against_waves(monkeypatch, program: str, seq, options: dict | None, shape: dict | None, **env):
    """``program`` on the wave executor, then, with ``env`` set, on the persistent executor as one
    kernel of static dispatch: its outputs the waves' bit for bit (asserted). Returns the
    persistent runner (the caller closes it), the inputs and the waves' outputs."""
    monkeypatch.setenv("PTO_MK_SPLIT", "off")
    monkeypatch.setenv("PTO_DISPATCH", "static")
    rw, inputs, want = run_program(program, "waves", seq, options, shape)
    rw.close()
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    rp, _, got = run_program(program, "persistent", seq, options, shape)
    try:
        for k in want:
            assert torch.equal(got[k], want[k]), k
    except BaseException:
        rp.close()
        raise
    return rp, inputs, want


CASES = [("model", None, {"config": "tiny"}, {"batch": 2, "cache": 128}),
         ("llama7b", 40, {"attention": "fused"}, None),
         ("llama7b", 40, {"attention": "split"}, None),
         ("llama7b", 33, {"attention": "pair", "causal": False}, None)]


@pytest.mark.interpret
@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs the Triton interpreter")
@pytest.mark.parametrize("program,seq,options,shape", CASES, ids=["decode", "fused", "split", "pair"])
def test_an_order_only_data_dependencies_allow_gives_the_waves_results(program, seq, options, shape, monkeypatch):
    """The persistent executor with ``PTO_MK_DEPS=data`` (one kernel, static dispatch, one
    program under the interpreter): in the queue's order, then in an order that runs items
    ahead of items of their tasks' predecessors where no data conflicts, the wave executor's
    outputs bit for bit (an item that ran before a producer of what it reads would read stale
    values), and no wait gives up."""
    rp, inputs, want = persistent_against_waves(monkeypatch, program, seq, options, shape, PTO_MK_DEPS="data")
    try:
        ex = rp.executor
        (kernel,) = ex.kernels
        plan = kernel.plan
        assert plan.boxes is not None
        order = _adversarial_order(plan, kernel.counters)
        # (the order breaks the tasks' dependencies somewhere: an item before one of a predecessor's)
        task, first = plan.items[:, 0], np.full(plan.n_tasks, plan.n_items)
        position = np.empty(plan.n_items, np.int64)
        position[order] = np.arange(plan.n_items)
        np.minimum.at(first, task, position)
        last = np.zeros(plan.n_tasks, np.int64)
        np.maximum.at(last, task, position)
        early = [(p, s) for p, s in zip(plan.edge_sources.tolist(), plan.succ.tolist()) if first[s] < last[p]]
        assert early, "the order keeps every task dependency: it checks nothing"
        _run_in_order(ex, kernel, order, inputs, want)
    finally:
        rp.close()


@pytest.mark.interpret
@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs the Triton interpreter")
def test_a_traced_run_waits_per_counter(monkeypatch):
    """With data dependencies the report's dependency wait is measured per waited counter: from
    the last end of the items that release it to the first start of the items that wait on it,
    each positive (every item starts after the items it waits for end), one per counter that has
    a count."""
    from pto.engine import Runner, resolve

    monkeypatch.setenv("PTO_MK_DEPS", "data")
    monkeypatch.setenv("PTO_MK_SPLIT", "off")
    job = resolve("llama7b", device="cpu", backend="triton", executor="persistent", options={"attention": "fused"})
    runner = Runner(job, 40, record=True)
    try:
        runner(job.program.inputs(job.settings, job.program.shape(40), "cpu"))
        ex = runner.executor
        waits = ex._release_waits(ex.trace_records())
        (kernel,) = ex.kernels
        assert len(waits) == int((kernel.counters.init > 0).sum()) > int((ex.plan.pending > 0).sum())
        assert waits.min() > 0
        assert ex.report()["dependency_wait_ticks"] == round(float(np.median(waits)), 3)
    finally:
        runner.close()


def _hidden_edge_module(war: bool):
    """A graph whose runtime edges leave one out, ordered through a task in between: ``fill``
    (4 items) writes X's 16 rows from I; ``tail`` (2 items), whose bound region is X's first 16
    rows (from its origin to its furthest access), reads rows 0-3 and writes rows 12-15, so the
    runtime takes it as writing all 16 and hides the entries before it. Without ``war``:
    ``middle`` then reads rows 8-11 into Y (its edge from ``fill`` left out: a read after a
    write). With ``war``: ``middle`` reads rows 8-11 into Y before ``tail``, and ``over`` then
    writes rows 8-11 from J (its edge from ``middle`` left out: a write after a read)."""
    from pto import InCore, Orchestration, f32

    def kernel(name, rows, src_row, dst_row, items):
        k = InCore(name)
        src, dst = k.memref("src", f32), k.memref("dst", f32)
        h = k.parallel("h", items)
        t = k.tile("t", rows, 8 // items, f32)
        k.load(t, src, src_row, h * (8 // items))
        k.store(dst, dst_row, h * (8 // items), t)
        return k.build()

    def tail():
        k = InCore("tail")
        x = k.memref("x", f32)
        h = k.parallel("h", 2)
        t = k.tile("t", 4, 4, f32)
        k.load(t, x, 0, h * 4)
        k.store(x, 12, h * 4, t)
        return k.build()

    o = Orchestration("hidden")
    i, j = o.input("I", 16, 8, f32), o.input("J", 4, 8, f32) if war else None
    x, y = o.temp("X", 16, 8, f32), o.output("Y", 4, 8, f32)
    o.call(kernel("fill", 16, 0, 0, 4), {"src": i, "dst": x})
    middle = kernel("middle", 4, 8, 0, 2)
    if war:
        o.call(middle, {"src": x, "dst": y})
    o.call(tail(), {"x": x})
    if war:
        o.call(kernel("over", 4, 0, 8, 2), {"src": j, "dst": x})
    else:
        o.call(middle, {"src": x, "dst": y})
    return o.module()


@pytest.mark.interpret
@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs the Triton interpreter")
@pytest.mark.parametrize("war", [False, True], ids=["read-after-write", "write-after-read"])
def test_an_edge_the_runtime_orders_through_a_task_in_between_is_kept(war):
    """The runtime's tensor map leaves out an edge that a later writer's region orders (the
    writer covers the earlier entries); an item must not then run ahead of what that edge
    ordered through data the writer's items leave untouched. ``tail`` stores 8 of the 16 rows
    its region spans, so its items take the whole region: in the order the counters allow that
    runs consumers first, Y is I's rows 8-11 and X what the program's order writes, as in the
    queue's order."""
    from pto.backends.triton import MegakernelSettings, TritonBackend
    from pto.engine import build_module_graph
    from pto.exec.plan import make_plan

    graph = build_module_graph(_hidden_edge_module(war), {}).graph
    try:
        backend = TritonBackend("cpu")
        plan = make_plan(graph, list(graph.tensor_ids), {}, flags=backend.task_flags, deps="data")
        names = [f.name for f in plan.variants]
        edges = {(names[p], names[s]) for p, s in zip(plan.edge_sources.tolist(), plan.succ.tolist())}
        left_out = ("middle", "over") if war else ("fill", "middle")
        assert left_out not in edges  # (the edge the runtime orders through tail)
        order = _adversarial_order(plan, plan.counters())
        g = torch.Generator().manual_seed(7)
        for p in (plan, plan.reordered(order)):
            tensors = {"I": torch.randn(16, 8, generator=g), "X": torch.zeros(16, 8), "Y": torch.zeros(4, 8),
                       **({"J": torch.randn(4, 8, generator=g)} if war else {})}
            kernel = backend.megakernel(p, tensors, MegakernelSettings(dispatch="static", programs=1, split="off"))
            kernel.launch()
            assert kernel.gave_up() is None
            x = tensors["I"].clone()
            x[12:16] = x[0:4]
            if war:
                x[8:12] = tensors["J"]
            assert torch.equal(tensors["Y"], tensors["I"][8:12]) and torch.equal(tensors["X"], x)
    finally:
        graph.close()


def _random_plan(seed: int, runs: int):
    from pto.backends.triton import TritonBackend
    from pto.exec.plan import make_plan
    from pto.runtime.graph import CompiledProgram
    from tests.exec import item_deps_programs as rp

    prog = rp.random_program(seed)
    graph = CompiledProgram.get(prog.module).build_graph({})
    try:
        plan = make_plan(graph, list(graph.tensor_ids), {}, flags=TritonBackend("cpu").task_flags, runs=runs,
                         deps="data")
    finally:
        graph.close()
    # (the plan's tasks are the calls, in the order they were made)
    assert [plan.variants[t].name for t in range(plan.n_tasks)] == [c.kind.fn.name for c in prog.calls]
    return prog, plan


def _unordered_conflicts(prog, plan, counters) -> list[tuple[int, int]]:
    """The pairs (j, i) of items of different tasks, j's task called first, whose elements
    conflict (one writes what the other reads or writes; element sets from what each function
    is known to do) with no chain of waits from j to i."""
    from tests.exec.item_deps_programs import element_sets

    task = plan.items[:, 0].astype(np.int64)
    first, count = plan.item_indices(plan.items)
    sets = element_sets(prog, np.asarray(first), np.asarray(count), task)
    preds = item_predecessors(plan, counters)
    assert all(j < i for i, p in enumerate(preds) for j in p)  # the queue is a topological order
    ancestors = []
    for p in preds:
        a = 0
        for j in p:
            a |= ancestors[j] | (1 << j)
        ancestors.append(a)
    out = []
    for i, (ri, wi) in enumerate(sets):
        for j in np.flatnonzero(task < task[i]).tolist():
            rj, wj = sets[j]
            if (wj & (ri | wi) or rj & wi) and not (ancestors[i] >> j) & 1:
                out.append((j, i))
    return out


@pytest.mark.parametrize("runs", [0, 2, 3])
@pytest.mark.parametrize("seed", range(12))
def test_random_programs_order_every_conflicting_pair_of_items(seed, runs):
    """The fuzzer: random programs of calls on row ranges that overlap in part (row blocks, a
    causal prefix read, a read shifted past an item's rows, column halves in place, interleaved
    rows, stores with holes), each item's elements known from what its function does. Every two
    items of different tasks that conflict on an element are ordered by a chain of the plan's
    waits, and the waits are finer than the tasks' somewhere (else this checks nothing new)."""
    prog, plan = _random_plan(seed, runs)
    c = plan.counters()
    assert _unordered_conflicts(prog, plan, c) == []
    task_waits = plan.pending_items[plan.items[:, 0]]
    assert (c.init[c.counter] < task_waits).any()


def test_the_fuzzers_oracle_finds_a_dropped_wait():
    """The same check with one item's wait dropped (its counter the one that is never waited
    on) reports the pair it leaves unordered: the oracle can fail."""
    from pto.exec.item_deps import Counters

    prog, plan = _random_plan(0, 0)
    c = plan.counters()
    zero = int(np.flatnonzero(c.init == 0)[0])
    preds = item_predecessors(plan, c)
    victim = max(i for i, p in enumerate(preds) if p)  # the last item that waits for anything
    dropped = Counters(c.counter.copy(), c.init, c.row, c.rel_ptr, c.rel)
    dropped.counter[victim] = zero
    bad = _unordered_conflicts(prog, plan, dropped)
    assert bad and all(i == victim for _, i in bad)


@pytest.mark.interpret
@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs the Triton interpreter")
@pytest.mark.parametrize("seed", range(4))
def test_random_programs_in_orders_only_data_dependencies_allow_give_the_waves_results(seed):
    """The fuzzer's programs run end to end (one kernel, static dispatch, one program under the
    interpreter): the persistent executor with data dependencies in the queue's order, in the
    order that runs each ready item latest in the queue first, and in a seeded random order of
    the items under their waits, each the wave executor's outputs bit for bit. (Weaker than the
    element check above, which it complements with the kernels themselves: an order need not
    exploit a missing wait.)"""
    from pto.backends import get_backend
    from pto.backends.triton import MegakernelSettings
    from pto.data.buffers import allocate, tensor_shapes
    from pto.exec import get_executor
    from pto.runtime.graph import CompiledProgram
    from tests.exec import item_deps_programs as rp

    prog = rp.random_program(seed)
    x = rp.inputs(seed)
    fn = prog.module.entry_function
    outs = {}
    for executor in ("waves", "persistent"):
        graph = CompiledProgram.get(prog.module).build_graph({})
        try:
            tensors = allocate(fn, tensor_shapes(fn, {}), {k: v.clone() for k, v in x.items()}, "cpu")
            kw = {"settings": MegakernelSettings(split="off", dispatch="static", deps="data")} \
                if executor == "persistent" else {}
            ex = get_executor(executor, get_backend("triton", "cpu"), tensors, **kw)
            ex.run(graph)
            outs[executor] = (ex, tensors)
        finally:
            graph.close()
    _, want = outs["waves"]
    ex, tensors = outs["persistent"]
    assert torch.equal(tensors["y"], want["y"])
    (kernel,) = ex.kernels
    plan = kernel.plan
    shuffled = _adversarial_order(plan, kernel.counters, np.random.default_rng(seed))
    for order in (_adversarial_order(plan, kernel.counters), shuffled):
        assert sorted(order.tolist()) == list(range(plan.n_items))
        _run_in_order(ex, kernel, order, x, want)
