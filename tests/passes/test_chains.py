"""Fusion candidates (pto.passes.fusion.chains): loops whose calls carry a region from iteration to
iteration, found on the LLaMA layer's split and pair attention and on small programs written for
each rule, and none where no region is carried."""

from __future__ import annotations

import pytest

from pto import InCore, Orchestration, f32, programs
from pto.machine.target import get
from pto.passes.fusion.chains import find_chains


def _fn(name: str, params: tuple[str, ...], writes: tuple[str, ...]):
    """A 2x2 tile function reading every parameter and writing ``writes`` (in place when it also
    reads them)."""
    k = InCore(name)
    mems = {p: k.memref(p, f32) for p in params}
    t, u = k.tile("t", 2, 2, f32), k.tile("u", 2, 2, f32)
    k.full(t, 0.0)
    for p in params:
        if p not in writes or p.startswith("io"):
            k.load(u, mems[p], 0, 0)
            k.add(t, t, u)
    for p in writes:
        k.store(mems[p], 0, 0, t)
    return k.build()


ACC = _fn("acc_step", ("x", "io_acc"), ("io_acc",))  # acc += x
PRODUCE = _fn("produce", ("x", "s"), ("s",))  # s = f(x)
CONSUME = _fn("consume", ("s", "io_acc"), ("io_acc",))  # acc += g(s)


def _module(body, names=("x", "acc")):
    o = Orchestration("prog")
    n = o.scalar("n")
    T = {name: o.inout(name, 2 * n + 2, 2, f32) for name in names}
    with o.for_loop("i", 0, n) as i:
        body(o, T, i)
    return o.module()


def test_an_accumulation_over_a_loop_is_a_chain():
    """acc += x[i] for every i: the accumulator's region is the same in every iteration and read
    first: carried."""
    m = _module(lambda o, T, i: o.call(ACC, {"x": (T["x"], 2 * i, 0, 2, 2), "io_acc": (T["acc"], 0, 0, 2, 2)}))
    (c,) = find_chains(m)
    assert (c.loop, c.calls, c.carried, c.scratch, c.handoffs) == ("i", ("acc_step",), ("acc",), (), ())


def test_a_region_that_moves_with_the_loop_is_not_carried():
    """y[i] = f(x[i]) in place at a different row each iteration: nothing crosses iterations."""
    m = _module(lambda o, T, i: o.call(ACC, {"x": (T["x"], 2 * i, 0, 2, 2), "io_acc": (T["y"], 2 * i, 0, 2, 2)}),
                ("x", "y"))
    assert find_chains(m) == []


def _produce_consume(o, T, i):
    o.call(PRODUCE, {"x": (T["x"], 2 * i, 0, 2, 2), "s": (T["s"], 0, 0, 2, 2)})
    o.call(CONSUME, {"s": (T["s"], 0, 0, 2, 2), "io_acc": (T["acc"], 0, 0, 2, 2)})


def test_a_producer_hands_its_scratch_to_the_chain():
    """s = f(x[i]); acc += g(s): s is rewritten whole each iteration (scratch) and read only by the
    next call (a handoff), acc carried; both calls are the chain."""
    (c,) = find_chains(_module(_produce_consume, ("x", "s", "acc")))
    assert c.calls == ("produce", "consume") and c.carried == ("acc",) and c.scratch == ("s",)
    assert c.handoffs == (("produce", "consume", "s"),)


def test_an_intermediate_read_outside_the_loop_is_no_handoff():
    """The same loop, and s read again after it: it must reach memory."""
    def body(o, T, i):
        _produce_consume(o, T, i)

    o = Orchestration("prog")
    n = o.scalar("n")
    T = {name: o.inout(name, 2 * n + 2, 2, f32) for name in ("x", "s", "acc", "y")}
    with o.for_loop("i", 0, n) as i:
        body(o, T, i)
    o.call(CONSUME, {"s": (T["s"], 0, 0, 2, 2), "io_acc": (T["y"], 0, 0, 2, 2)})
    (c,) = find_chains(o.module())
    assert c.handoffs == () and c.calls == ("consume",)


@pytest.mark.parametrize("attention,calls,carried", [
    ("split", ("flash_score", "flash_softmax", "flash_output"), {"m", "l", "acc"}),
    ("pair", ("flash_pair",), {"m", "l", "acc"}),
    ("fused", None, None)])
def test_the_llama_layers_kv_loop_carries_the_online_softmax_state(attention, calls, carried):
    """The seed's split attention: per kv tile score, softmax and output tasks carry each q tile's
    m, l and acc through memory, s and alpha pass from task to task; the fused layer has no such
    loop (its kv loop is inside one function)."""
    prog = programs.get("llama7b")
    m = prog.written(prog.settings(device="cpu", config="tiny", target=get("x86_64"), attention=attention))
    chains = find_chains(m)
    if calls is None:
        assert chains == []
        return
    (c,) = chains
    assert c.loop == "kj" and c.calls == calls and set(c.carried) == carried
    if attention == "split":
        assert set(c.scratch) == {"s", "alpha"} and ("flash_softmax", "flash_output", "alpha") in c.handoffs


def test_pto_graph_reports_the_chains():
    """``pto graph`` (build only) lists them: in its JSON report and one line each in its text; with
    the fusion on (the default) it lists what was fused instead, and no chain is left."""
    from pto.cli.commands.graph import build_only, format_report
    from pto.engine import resolve

    res = build_only(resolve("llama7b", device="cpu", options={"attention": "pair", "fuse": False}), 100)
    (c,) = res["fusable"]
    assert c["loop"] == "kj" and c["calls"] == ["flash_pair"] and set(c["carried"]) == {"m", "l", "acc"}
    assert "fusable: loop kj (llama7b.py:" in format_report(res) and "fused" not in res
    res = build_only(resolve("llama7b", device="cpu", options={"attention": "pair"}), 100)
    assert res["fusable"] == [] and [f["kind"] for f in res["fused"]] == ["chain", "chain", "producer"]
    assert "fused: loop kj: flash_pair -> chain_flash_pair" in format_report(res)
    assert build_only(resolve("llama7b", device="cpu"), 100)["fusable"] == []


def test_a_loop_with_nested_statements_on_the_same_tensors_is_not_a_chain():
    """The decode step's layer loop carries the residual stream x, but its per-sequence loop
    between the projections reads qkv and writes attn: the direct calls are not the whole body,
    so no chain is reported (a fusion of them alone would be wrong)."""
    prog = programs.get("model")
    s = prog.settings(device="cpu", config="tiny", target=get("x86_64"))
    assert find_chains(prog.build(s, prog.shape({"cache": 64, "batch": 1}))) == []
