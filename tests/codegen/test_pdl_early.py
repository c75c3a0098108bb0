"""Loads moved before the programmatic-dependent-launch wait (``RenderOptions.pre``, the "auto"
policy): where the renderer puts the wait and the signal, which loads may move ahead of it, the
backend's policy per batch, and the wave executor's flags (``TaskBatch.readonly``, ``chain``) on
a decode step run by the reference evaluator with each function's loads moved as the renderer
moves them, which must compute the same bits (the GPU run of the same step: tests/gpu)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from pto.incore.gemv import gemv_residual_tile  # noqa: E402

from pto import InCore  # noqa: E402
from pto.backends.torch_backend import TorchBackend  # noqa: E402
from pto.backends.triton import TritonBackend  # noqa: E402
from pto.codegen.triton import RenderOptions, render  # noqa: E402
from pto.codegen.triton.body import early_loads  # noqa: E402
from pto.data.batch import RegionBatch, TaskBatch  # noqa: E402
from pto.errors import BuildError, UsageError  # noqa: E402
from pto.ir.analysis import param_access, specialize  # noqa: E402
from pto.ir.dtypes import DType  # noqa: E402
from tests.codegen.tritonkit import jobs_sm90, path_flags, tiny_decode_runner  # noqa: E402
from tests.sm90 import compile_sm90  # noqa: E402


def _gemv(K: int, bk: int):
    """y = r + x @ w.T, blocks of 4 outputs, K steps of ``bk`` (one step when bk >= K)."""
    return specialize(gemv_residual_tile(DType.BF16, 1, K, 64, 4, bk))


def _device_lines(kern) -> list[str]:
    src = kern.source
    return src[src.index("def d_"):src.index(f"def {kern.name}(")].splitlines()


def _at(lines: list[str], text: str) -> int:
    return next(i for i, line in enumerate(lines) if text in line)


@pytest.mark.parametrize("mode", ["late", "chain"])
def test_inputs_load_before_the_wait_and_everything_else_after(mode):
    """A one-step GEMV: its weight block loads first, then the wait, then x, the residual and the
    store; the kernel itself no longer waits. The signal: after the device function ("late"),
    right after the wait ("chain"); never before the wait ("early" is refused: the next launch
    would start, and load early, before this one's predecessor is done). The schedule digest is
    the plain kernel's."""
    plain = render(_gemv(576, 1024))
    kern = render(_gemv(576, 1024), RenderOptions(pdl=mode, pre=("w",)))
    assert kern.waits and kern.pdl == mode
    dev = _device_lines(kern)
    wait = _at(dev, "_gdc_wait()")
    assert _at(dev, "= P_w + _r") < wait < _at(dev, "= P_x + _r") < _at(dev, "= P_r + _r") < _at(dev, "tl.store(")
    assert [line.split("=")[0].strip() for line in dev[:wait] if "tl.load(_p" in line] == ["t_b", "t_b"]
    outer = kern.source.split(f"def {kern.name}(")[1]
    assert "_gdc_wait()" not in outer
    if mode == "chain":
        assert "_gdc_launch_dependents()" in dev[wait + 1] and "_gdc_launch_dependents" not in outer
    else:
        assert "_gdc_launch_dependents" not in "\n".join(dev)
        sig, call = outer.index("_gdc_launch_dependents()"), outer.index("(tab + task *")
        assert sig > call
    assert "for i_kk" not in "\n".join(dev)  # the loop that runs once is straight-line code
    assert kern.schedule_digest == plain.schedule_digest == plain.digest != kern.digest
    with pytest.raises(BuildError, match="pre needs pdl 'late' or 'chain'"):
        render(_gemv(576, 1024), RenderOptions(pdl="early", pre=("w",)))


def test_without_an_early_load_the_kernel_is_the_plain_pdl_one():
    """A K loop of four steps loads x and w in every step: nothing comes before the wait (the
    loop is not peeled), so the source is the plain PDL kernel's; without PDL ``pre`` is unread."""
    for mode in ("late", "chain"):
        plain = render(_gemv(4096, 1024), RenderOptions(pdl=mode))
        kern = render(_gemv(4096, 1024), RenderOptions(pdl=mode, pre=("w",)))
        assert not kern.waits and kern.source == plain.source
    assert render(_gemv(576, 1024), RenderOptions(pre=("w",))).source == render(_gemv(576, 1024)).source


def test_a_load_at_a_device_position_and_stores_wait():
    """A ``pre`` memref read at a position that is device data the launch before may write
    (load_scalar of a memref not in ``pre``) waits; one at a fixed row moves ahead; no store and no
    other memory comes before the wait. With the position in ``pre`` its load and the load at
    it move too."""
    k = InCore("rows_at")
    pos = k.memref("pos", DType.F32, shape=(1, 1))
    w = k.memref("w", DType.F32, shape=(64, 16))
    y = k.memref("y", DType.F32, shape=(2, 16))
    a, b = k.tile("a", 1, 16, DType.F32), k.tile("b", 1, 16, DType.F32)
    p = k.load_scalar("p", pos, 0, 0)
    k.load(a, w, p, 0)
    k.load(b, w, 3, 0)
    k.store(y, 0, 0, a)
    k.store(y, 1, 0, b)
    fn = k.build()
    body = early_loads(fn.body, frozenset({"w"}))
    assert [(i.op.value, i.dst) for i in body[:2]] == [("load", "b"), ("load_scalar", "p")]
    kern = render(fn, RenderOptions(pdl="late", pre=("w",)))
    dev = _device_lines(kern)
    wait = _at(dev, "_gdc_wait()")
    assert _at(dev, "t_b = ") < wait < _at(dev, "s_p = ") < _at(dev, "t_a = ") < _at(dev, "tl.store(")
    # no load moves above a store (two memrefs may be one tensor: an in-place residual)
    k2 = InCore("store_then_load")
    w2, y2 = k2.memref("w", DType.F32, shape=(2, 16)), k2.memref("y", DType.F32, shape=(2, 16))
    c, d = k2.tile("c", 1, 16, DType.F32), k2.tile("d", 1, 16, DType.F32)
    k2.load(c, w2, 0, 0)
    k2.store(y2, 0, 0, c)
    k2.load(d, w2, 1, 0)
    k2.store(y2, 1, 0, d)
    fn2 = k2.build()
    assert early_loads(fn2.body, frozenset({"w"})) == fn2.body  # c loads early; d stays after the store
    k3 = InCore("x_store_then_load")
    x3, w3, y3 = (k3.memref(n, DType.F32, shape=(2, 16)) for n in ("x", "w", "y"))
    e, f = k3.tile("e", 1, 16, DType.F32), k3.tile("f", 1, 16, DType.F32)
    k3.load(e, x3, 0, 0)
    k3.store(y3, 0, 0, e)
    k3.load(f, w3, 1, 0)
    k3.store(y3, 1, 0, f)
    assert early_loads(k3.build().body, frozenset({"w"})) is None
    # a position the launch before did not write (a load of a scalar of ``pre``): both move
    body = early_loads(fn.body, frozenset({"w", "pos"}))
    assert [(i.op.value, i.dst) for i in body[:3]] == [("load_scalar", "p"), ("load", "a"), ("load", "b")]
    dev = _device_lines(render(fn, RenderOptions(pdl="late", pre=("pos", "w"))))
    moved = max(_at(dev, "s_p = "), _at(dev, "t_a = "), _at(dev, "t_b = "))
    assert moved < _at(dev, "_gdc_wait()") < _at(dev, "tl.store(")


def test_a_later_phases_weights_wait_for_their_phase():
    """No load moves past a product: the folded FFN's gate and up weights load before the wait,
    its down projection's weights (after the gate and up products) where they are, not held in
    registers through the first phase (at one row that took a 16 KiB stack frame of spills)."""
    from pto.incore.gemv import gemv_norm_swiglu_down_tile

    from pto.ir.nodes import walk_instrs
    from pto.ir.ops import MATMUL, Op

    fn = specialize(gemv_norm_swiglu_down_tile(DType.BF16, 1, 64, 96, 8, 64, 64, 1e-5, xdtype=DType.F32))
    body = list(walk_instrs(early_loads(fn.body, frozenset({"g", "wg", "wu", "wd"}))))
    at = {(i.op, i.srcs[0] if i.op is Op.LOAD else i.dst): n for n, i in enumerate(body)}
    first_product = min(n for n, i in enumerate(body) if i.op in MATMUL)
    x_load = at[(Op.LOAD, "x")]
    assert at[(Op.LOAD, "wg")] < x_load and at[(Op.LOAD, "wu")] < x_load  # before the wait
    assert at[(Op.LOAD, "wd")] > first_product


@pytest.mark.sm90
@pytest.mark.slow
def test_the_early_load_stays_ahead_of_the_wait_in_the_ptx(tmp_path):
    """Compiled for an H100 (no GPU needed): a 16-byte weight load is issued before
    ``griddepcontrol.wait``, the signal follows the wait, and every store comes after."""
    kern = render(_gemv(576, 1024), RenderOptions(pdl="chain", pre=("w",)))
    (job,) = jobs_sm90([(kern, path_flags(kern.fn, True))])
    job["options"]["launch_pdl"] = True
    (res,) = compile_sm90([job], tmp_path)
    assert res["ok"], res.get("error")
    ptx = res["ptx"]
    wait = ptx.index("griddepcontrol.wait")
    assert ptx.index("ld.global.v4") < wait < ptx.index("griddepcontrol.launch_dependents")
    assert wait < ptx.index("st.global")


def _hopper(monkeypatch, policy: str | None = None) -> TritonBackend:
    """A compiling backend as on an H100 (the capability as its driver reports it; nothing runs)."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    return TritonBackend("cuda", pdl=policy)


def _batch(fn, readonly=frozenset(), chain=False) -> TaskBatch:
    one = torch.zeros(1, dtype=torch.int64)
    mems = {p.name: RegionBatch(torch.zeros(64, 1024, dtype=torch.bfloat16), one, one, one + 1, one + 1)
            for p in fn.memrefs}
    return TaskBatch(fn, mems, {}, 1, frozenset(readonly), chain)


def test_auto_renders_late_and_chains_where_the_next_loads_early(monkeypatch):
    """"auto" (the default on sm_90): a batch's inputs load early, it signals "late", or right
    after its wait where the executor says the next batch loads early; "late" loads nothing
    early; a K loop of several steps loads nothing early under any policy."""
    monkeypatch.delenv("PTO_PDL", raising=False)
    be = _hopper(monkeypatch)
    assert be.pdl == "auto" and be.options.pdl == "late"
    one, four = _gemv(576, 1024), _gemv(4096, 1024)
    cfg = be.launch_config(one)
    assert be.batch_options(cfg, _batch(one)).pre == ()
    opts = be.batch_options(cfg, _batch(one, {"w"}, chain=True))
    assert opts.pre == ("w",) and opts.pdl == "chain"
    assert be.loads_early(_batch(one, {"w"})) and not be.loads_early(_batch(one))
    assert not be.loads_early(_batch(four, {"w"}))
    late = _hopper(monkeypatch, "late")
    assert not late.loads_early(_batch(one, {"w"}))
    assert late.batch_options(late.launch_config(one), _batch(one, {"w"}, chain=True)).pdl == "late"
    # what may load early is the executor's to say: not a schedule's, nor the backend's options
    with pytest.raises(UsageError, match="unknown launch setting 'pre'"):
        TritonBackend("cuda", launch={one.name: {"pre": ("w", "x")}}).launch_config(one)
    given = TritonBackend("cuda", options=RenderOptions(pre=("x",)))
    assert given.batch_options(given.launch_config(one), _batch(one)).pre == ()


def test_a_function_named_late_loads_nothing_early_and_is_not_chained_for(monkeypatch):
    """``PTO_PDL_LATE`` names functions whose launches load nothing before their wait under
    "auto": their batches' early loads go (so the batch before them is not chained for them),
    another function's stay; anything but names separated by commas is one line naming it."""
    monkeypatch.delenv("PTO_PDL", raising=False)
    one = _gemv(576, 1024)
    monkeypatch.setenv("PTO_PDL_LATE", f" {one.name}, other_tile ")
    be = _hopper(monkeypatch)
    opts = be.batch_options(be.launch_config(one), _batch(one, {"w"}, chain=True))
    assert opts.pre == () and opts.pdl == "chain" and not be.loads_early(_batch(one, {"w"}))
    monkeypatch.setenv("PTO_PDL_LATE", "other_tile")
    be = _hopper(monkeypatch)
    assert be.batch_options(be.launch_config(one), _batch(one, {"w"})).pre == ("w",)
    assert be.loads_early(_batch(one, {"w"}))
    monkeypatch.setenv("PTO_PDL_LATE", "gemv-residual")
    with pytest.raises(UsageError, match="PTO_PDL_LATE='gemv-residual': InCore function names"):
        _hopper(monkeypatch)


class _EarlyLoadsEvaluator(TorchBackend):
    """The reference evaluator running every batch's function with its loads moved as the Triton
    kernel issues them before its wait; the "auto" policy's questions answered by a compiling
    Triton backend (as on an H100). Records each batch: its flags, the memrefs it loads early, its
    parameters' directions and the storages they are bound to."""

    pdl = "auto"

    def __init__(self, triton: TritonBackend):
        super().__init__()
        self.triton = triton
        self.seen: list[dict] = []

    def loads_early(self, batch):
        return self.triton.loads_early(batch)

    def prepare(self, batch):
        fn = specialize(batch.fn) if batch.fn.dims else batch.fn
        body = early_loads(fn.body, batch.readonly) if batch.readonly else None
        self.seen.append({"readonly": batch.readonly, "chain": batch.chain, "early": self.triton.loads_early(batch),
                          "io": {p: a.direction for p, a in param_access(fn).items()},
                          "at": {p: m.tensor.untyped_storage().data_ptr() for p, m in batch.mems.items()}})
        assert (body is not None) == bool(self.seen[-1]["early"])
        if body is not None:
            fn = type(fn)(**{**fn.__dict__, "body": body})
        return super().prepare(TaskBatch(fn, batch.mems, batch.scalars, batch.size))


def test_a_decode_step_with_early_loads_computes_the_same_bits(monkeypatch):
    """The tiny model's decode step (its projections in one K step, as SmolLM2's on a GPU, but the
    down projection, which streams its weights over K steps as the 8B model's does) through
    the wave executor: the first batch loads nothing early (its predecessor is whatever ran before
    the run); each other batch may load early what its function only reads and the batch before
    it does not write (the weights, the residual, the position); a batch is flagged ``chain``
    exactly when the next one loads an input (a weight) early, and issued once the next one is
    seen; the results are the plain run's, bit for bit."""
    from dataclasses import replace

    from pto.orchestration.model import program as mp

    monkeypatch.setattr(mp, "TINY_TILING", replace(mp.TINY_TILING, bk=32, qkv_bk=512, o_bk=512, ffn_bk=512))
    run = tiny_decode_runner(seed=3)
    module = run.module
    held, arrived = [], []  # how many batches seen and not yet issued

    def count(ex, backend):
        see, prepare = ex._see, backend.prepare

        def seen_one(*args):
            arrived.append(1)
            return see(*args)

        def prepared(batch):
            held.append(len(arrived) - len(held) - 1)
            return prepare(batch)

        ex._see, backend.prepare = seen_one, prepared

    backend = _EarlyLoadsEvaluator(_hopper(monkeypatch, "auto"))
    outs = [run(TorchBackend()), run(backend, count)]
    tensors = outs[-1]
    seen = backend.seen
    weights = {tensors[t.name].untyped_storage().data_ptr() for t in module.entry_function.tensors if t.role == "input"}
    assert seen[0]["readonly"] == frozenset() and not seen[-1]["chain"]

    def writes(x):
        return {x["at"][p] for p, d in x["io"].items() if d != "in"}

    for a, b in zip(seen, seen[1:]):  # what may still run when b starts: a
        assert b["readonly"] == {p for p, d in b["io"].items() if d == "in" and b["at"][p] not in writes(a)}
        assert a["chain"] == any(b["at"][p] in weights for p in b["early"])
    # a batch is issued once the next is seen
    assert max(held) == 1 and held[-1] == 0
    assert any(b["early"] and not b["early"] & {p for p in b["at"] if b["at"][p] in weights} for b in seen)
    assert any(b["chain"] for b in seen) and not all(b["early"] for b in seen)
    for name in ("logits", "tok", "pos", "k_cache", "v_cache"):
        assert torch.equal(outs[0][name], outs[1][name]), name


def _copy_fn(name: str, parallel=None):
    """y = x, 1 x 16 (over a parallel axis of ``parallel`` blocks: a scalar's value, so possibly
    none for every task)."""
    k = InCore(name)
    x, y = k.memref("x", DType.F32, shape=(1, 16)), k.memref("y", DType.F32, shape=(1, 16))
    if parallel is not None:
        k.parallel("j", k.scalar(parallel))
    t = k.tile("t", 1, 16, DType.F32)
    k.load(t, x, 0, 0)
    k.store(y, 0, 0, t)
    return k.build()


def test_what_a_batch_may_load_early_follows_the_launch_before_it():
    """``TaskBatch.readonly``: what the function only reads and neither it nor the batch before
    writes; nothing for the run's first batch; and where the batch before may launch nothing (a
    parallel axis whose extent is data), what the batch before that writes is excluded too."""
    from pto.exec.waves import WaveExecutor

    T, U, V, W = (torch.zeros(1, 16) for _ in range(4))
    ex = WaveExecutor(TorchBackend(), {})
    plain, maybe = _copy_fn("copy"), _copy_fn("copy_n", parallel="n")

    def batch(fn, x, y):
        one = torch.zeros(1, dtype=torch.int64)
        return fn, {p: RegionBatch(t, one, one, one + 1, one + 16) for p, t in (("x", x), ("y", y))}

    def run(*batches):
        ex._reset()
        return [ex._settled(*batch(*b)) for b in batches]

    assert run((plain, U, T), (plain, T, V), (plain, W, V)) == [frozenset(), frozenset(), {"x"}]
    assert run((plain, U, T), (maybe, W, V), (plain, T, U)) == [frozenset(), {"x"}, frozenset()]
    assert run((maybe, U, T), (plain, W, V)) == [frozenset(), frozenset()]
    assert run((plain, U, T), (plain, V, V)) == [frozenset(), {"x"}]  # its own store: the renderer's
    assert run((plain, U, T), (plain, T[:, 8:], V)) == [frozenset(), frozenset()]  # a view of what was written
