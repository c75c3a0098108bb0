"""The schedule database and pto tune: lookup order (user, shipped, heuristics), stale entries
ignored, corrupt files set aside, the shipped H100 entries current for today's kernels, a tuning
run under the Triton interpreter that stores what it measured (also when interrupted), and wrong
candidates never kept."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings

import pytest
import torch

from pto import f32
from pto.backends.triton import TritonBackend
from pto.backends.triton.schedules import Entry, ScheduleDB, bucket, device_key, triton_version
from pto.ir.analysis import specialize
from tests.schedules.family import SHIPPED, family_kernels


def _gemm():
    from pto.incore.matmul import gemm_tile

    return specialize(gemm_tile(f32, 32, 64, 32))


def _db(tmp_path, name="TestGPU 9000"):
    return ScheduleDB(name, user_dir=tmp_path / "user", shipped=(tmp_path / "shipped",))


def test_buckets_follow_the_batch_size():
    assert [bucket(n) for n in (1, 16, 17, 64, 65, 4096)] == ["small", "small", "medium", "medium", "large", "large"]


def test_lookup_order_user_then_shipped_then_heuristics(tmp_path):
    fn = _gemm()
    db = _db(tmp_path)
    be = TritonBackend("cpu", schedules=db)
    digest = be.kernel(fn).digest
    heuristic = be.launch_config(fn, 100)
    assert db.lookup(fn.name, fn.variant_name, 100, digest) == ({}, "heuristic")
    shipped = ScheduleDB(db.device, user_dir=tmp_path / "shipped")  # writes where the shipped files live
    shipped.store(fn.name, Entry(fn.variant_name, "large", {"num_warps": 2, "num_stages": 5}, triton_version(),
                                 digest))
    assert db.lookup(fn.name, fn.variant_name, 100, digest) == ({"num_warps": 2, "num_stages": 5}, "shipped")
    db.store(fn.name, Entry(fn.variant_name, "large", {"num_warps": 16}, triton_version(), digest))
    assert db.lookup(fn.name, fn.variant_name, 100, digest) == ({"num_warps": 16}, "user")
    cfg = be.launch_config(fn, 100)
    assert cfg["num_warps"] == 16 and cfg["num_stages"] == heuristic["num_stages"]
    # another bucket has no entry: the heuristics
    assert be.launch_config(fn, 3) == heuristic
    # explicit overrides still win over the database
    forced = TritonBackend("cpu", schedules=db, launch={fn.name: {"num_warps": 1}})
    assert forced.launch_config(fn, 100)["num_warps"] == 1


def test_an_h200_runs_the_h100s_shipped_schedules_where_it_ships_none_of_its_own(tmp_path):
    fn = _gemm()
    digest = TritonBackend("cpu").kernel(fn).digest
    h200 = ScheduleDB("NVIDIA H200", user_dir=tmp_path / "user", shipped=(tmp_path / "shipped",))
    other = ScheduleDB("AMD Instinct MI300X", user_dir=tmp_path / "user", shipped=(tmp_path / "shipped",))

    def ship(device, params):  # writes where the shipped files live
        ScheduleDB(device, user_dir=tmp_path / "shipped").store(
            fn.name, Entry(fn.variant_name, "large", params, triton_version(), digest))

    ship("NVIDIA H100 80GB HBM3", {"num_warps": 2})
    assert h200.lookup(fn.name, fn.variant_name, 100, digest) == ({"num_warps": 2},
                                                                   "shipped for nvidia_h100_80gb_hbm3")
    origin = TritonBackend("cpu", schedules=h200).launch_origin(fn, 100)
    assert "schedules pto ships for nvidia_h100_80gb_hbm3" in origin
    assert other.lookup(fn.name, fn.variant_name, 100, digest) == ({}, "heuristic")  # not of the H100's kin
    ship("NVIDIA H200", {"num_warps": 4})  # the device's own shipped entry comes first
    assert h200.lookup(fn.name, fn.variant_name, 100, digest) == ({"num_warps": 4}, "shipped")
    h200.store(fn.name, Entry(fn.variant_name, "large", {"num_warps": 8}, triton_version(), digest))
    assert h200.lookup(fn.name, fn.variant_name, 100, digest) == ({"num_warps": 8}, "user")
    assert [x.split(":")[0] for x in h200.explain(fn.name, fn.variant_name, 100, digest)] == [
        "user", "shipped", "shipped for nvidia_h100_80gb_hbm3"]


def test_the_shipped_llama_schedules_apply_on_an_h200(tmp_path):
    """An H200 (the GPU lent today) without a folder of its own finds the LLaMA layer's shipped
    H100 entries, every one of them (the H100's folder alone, in a tree of its own)."""
    import shutil

    from pto import programs

    (folder,) = programs.get("llama7b").schedules
    key = "nvidia_h100_80gb_hbm3"
    shutil.copytree(folder / key, tmp_path / "shipped" / key)
    folders = (tmp_path / "shipped",)
    h100 = ScheduleDB("NVIDIA H100 80GB HBM3", user_dir=tmp_path, shipped=folders)
    h200 = ScheduleDB("NVIDIA H200", user_dir=tmp_path, shipped=folders)
    files = sorted(h100.shipped_dirs[0].glob("*.json"))
    assert files
    for f in files:
        for e in h100.entries(f.stem, h100.shipped_dirs[0]):
            tasks = {"small": 1, "medium": 17, "large": 65}[e.bucket]
            # (on a Triton other than the entries' each is stale for both, and both say so)
            params, where = h100.lookup(f.stem, e.variant, tasks, e.source)
            kin = "shipped for nvidia_h100_80gb_hbm3" if where == "shipped" else where
            assert h200.lookup(f.stem, e.variant, tasks, e.source) == (params, kin), (f.stem, e.variant)
            assert [x.replace("shipped for nvidia_h100_80gb_hbm3", "shipped")
                    for x in h200.explain(f.stem, e.variant, tasks, e.source)] == \
                h100.explain(f.stem, e.variant, tasks, e.source)


def test_stale_entries_are_ignored_and_explained(tmp_path):
    fn = _gemm()
    db = _db(tmp_path)
    digest = TritonBackend("cpu").kernel(fn).digest
    db.store(fn.name, Entry(fn.variant_name, "small", {"num_warps": 2}, "0.0.1", digest))
    assert db.lookup(fn.name, fn.variant_name, 4, digest)[1] == "heuristic"
    assert "stale, measured with Triton 0.0.1" in db.explain(fn.name, fn.variant_name, 4, digest)[0]
    db.store(fn.name, Entry(fn.variant_name, "small", {"num_warps": 2}, triton_version(), "0" * 20))
    assert db.lookup(fn.name, fn.variant_name, 4, digest)[1] == "heuristic"
    why = db.explain(fn.name, fn.variant_name, 4, digest)
    assert len(why) == 2 and any("stale, measured for another kernel source" in w for w in why)


def test_one_variant_name_keeps_an_entry_per_kernel_source(tmp_path):
    """LLaMA-3-8B's flash attention has LLaMA-2-7B's variant name but reads each key/value head
    for 4 query heads: another kernel. Tuning one must not evict the other's entry."""
    from pto.machine.target import get as target
    from pto.programs import get
    from pto.runtime.graph import CompiledProgram

    prog = get("llama7b")
    kernels = {}
    for config in ("llama2-7b", "llama3-8b"):
        s = prog.settings(device="cuda", config=config, dtype="bf16", target=target("cuda_h100"), attention="fused")
        v = next(v for v in CompiledProgram.get(prog.build(s), target=s.target).variants
                 if v.func.name == "flash_fused")
        kernels[config] = (v.func.variant_name, TritonBackend("cpu").kernel(v.func).digest)
    (name2, src2), (name3, src3) = kernels["llama2-7b"], kernels["llama3-8b"]
    assert name2 == name3 and src2 != src3
    db = _db(tmp_path)
    db.store("flash_fused", Entry(name2, "large", {"num_warps": 4}, triton_version(), src2))
    db.store("flash_fused", Entry(name3, "large", {"num_warps": 8}, triton_version(), src3))
    assert db.lookup("flash_fused", name2, 128, src2) == ({"num_warps": 4}, "user")
    assert db.lookup("flash_fused", name3, 128, src3) == ({"num_warps": 8}, "user")
    db.store("flash_fused", Entry(name3, "large", {"num_warps": 2}, triton_version(), src3))  # re-tuned: replaced
    assert db.lookup("flash_fused", name3, 128, src3) == ({"num_warps": 2}, "user")
    assert len(db.entries("flash_fused")) == 2


def test_lookups_read_a_file_once_until_it_changes(tmp_path, monkeypatch):
    """Every launch that is not replayed looks its schedule up: a file is read once, and again
    only when it was replaced (another database object's store, as another process's tune)."""
    import pto.backends.triton.schedules as sched

    reads = []
    real = sched._read
    monkeypatch.setattr(sched, "_read", lambda path: reads.append(path) or real(path))
    fn = _gemm()
    db, other = _db(tmp_path), _db(tmp_path)
    other.store(fn.name, Entry(fn.variant_name, "large", {"num_warps": 2}, triton_version(), "x"))
    for _ in range(5):
        assert db.lookup(fn.name, fn.variant_name, 100, "x") == ({"num_warps": 2}, "user")
    assert len(reads) == 2  # other's store read the file before writing it; db read it once
    other.store(fn.name, Entry(fn.variant_name, "large", {"num_warps": 8}, triton_version(), "x"))
    assert db.lookup(fn.name, fn.variant_name, 100, "x") == ({"num_warps": 8}, "user")


def test_a_corrupt_file_is_set_aside_and_reported(tmp_path):
    fn = _gemm()
    db = _db(tmp_path)
    path = db.user_dir / f"{fn.name}.json"
    path.parent.mkdir(parents=True)
    path.write_text('{"format": 1, "entries": [{"variant": ')  # truncated
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        assert db.lookup(fn.name, fn.variant_name, 4, "x") == ({}, "heuristic")
    assert any("is corrupt" in str(x.message) for x in w)
    assert not path.exists() and path.with_suffix(".json.corrupt").exists()
    db.store(fn.name, Entry(fn.variant_name, "small", {"num_warps": 2}, triton_version(), "x"))  # rebuilt
    assert db.lookup(fn.name, fn.variant_name, 4, "x")[1] == "user"


@pytest.mark.parametrize("device", sorted(SHIPPED))
def test_shipped_entries_match_todays_kernels(device):
    """Every entry shipped for ``device`` names a variant the LLaMA layer (7B, or one of the
    family's built-in configurations) runs on that device and carries the current source hash of
    one of its kernels: a renderer change that would make them stale fails here (re-measure with
    pto tune and ship the new entries)."""
    digests: dict[str, set] = {}
    for variant, digest in family_kernels(TritonBackend("cpu"), SHIPPED[device]):
        digests.setdefault(variant, set()).add(digest)
    from pto import programs

    (folder,) = programs.get("llama7b").schedules
    # (every shipped folder is checked: SHIPPED names the device of each)
    assert {device_key(d) for d in SHIPPED} == {p.name for p in folder.iterdir() if p.is_dir()}
    db = ScheduleDB(device, user_dir=folder / "none", shipped=(folder,))
    files = sorted(db.shipped_dirs[0].glob("*.json"))
    assert files
    for f in files:
        for e in db.entries(f.stem, db.shipped_dirs[0]):
            assert e.variant in digests, e.variant
            assert e.source in digests[e.variant], e.variant
            assert e.triton == "3.6.0"


@pytest.mark.interpret
@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs the Triton interpreter")
def test_tune_stores_the_fastest_correct_candidate_and_keeps_it_when_interrupted(tmp_path):
    """Under the interpreter launch parameters do not change the speed, so which candidate wins
    is noise; what must hold: every candidate was checked and timed, what is stored is the
    fastest candidate and faster than what ran before (else nothing is stored), and the
    database answers with it."""
    from pto.cli.commands.tune import Search, tune

    db = _db(tmp_path, "cpu")
    space = {"gemm_tile": [{"num_warps": 4, "num_stages": 2}, {"num_warps": 8, "num_stages": 3}]}
    measured = []

    def record(label, cand, ms, why):
        measured.append((cand, ms, why))

    res = tune("bgemm", [40], Search(iterations=3, warmup=0, candidates=space, on_measure=record), db, device="cpu")
    (r,) = res["results"]
    assert r["function"] == "gemm_tile" and r["rejected"] == 0
    assert [c for c, _, _ in measured] == [None, *space["gemm_tile"]] and all(ms for _, ms, _ in measured)
    times = {str(c): ms for c, ms, _ in measured}
    stored = db.entries("gemm_tile")
    if r["best"] is None:
        assert stored == [] and min(times[str(c)] for c in space["gemm_tile"]) >= r["default_ms"]
    else:
        assert r["best_ms"] == min(times[str(c)] for c in space["gemm_tile"]) < r["default_ms"]
        digest = TritonBackend("cpu").kernel(_gemm_of(r)).digest
        assert db.lookup("gemm_tile", r["variant"], r["tasks"], digest) == (r["best"], "user")
        assert len(stored) == 1 and stored[0].ms == r["best_ms"]

    # Ctrl-C during the first candidate: the run says so, nothing after it was tried, and what
    # was stored (at most that candidate) stays
    db2 = _db(tmp_path / "b", "cpu")
    seen = []

    def interrupt(label, cand, ms, why):
        seen.append(cand)
        if cand is not None:
            raise KeyboardInterrupt

    res = tune("bgemm", [40], Search(iterations=1, warmup=0, candidates=space, on_measure=interrupt), db2,
               device="cpu")
    assert res["interrupted"] and seen == [None, space["gemm_tile"][0]]
    assert [e.params for e in db2.entries("gemm_tile")] in ([], [space["gemm_tile"][0]])


def _gemm_of(result):
    from pto.programs import get
    from pto.runtime.graph import CompiledProgram

    prog = get("bgemm")
    s = prog.settings()
    cp = CompiledProgram.get(prog.build(s), target=s.target)
    return next(v.func for v in cp.variants if v.func.variant_name == result["variant"])


def test_the_tuners_candidates_compile_kernels_of_their_own():
    """Compiles of one kernel are one at a time per @triton.jit object (pto.backends.triton.ahead's
    lock), so each candidate's backend loads a private copy of the kernel: one object per
    candidate, the same for the same candidate, none shared with the process's own."""
    from pto.backends.triton.loader import load_kernel
    from pto.cli.commands.tune import _backend

    fn = _gemm()
    shared = TritonBackend("cpu")
    a, b = (_backend("cpu", {"num_warps": w}, fn.variant_name) for w in (4, 8))
    again = _backend("cpu", {"num_warps": 8}, fn.variant_name)
    kernel = shared.kernel(fn)
    jits = [load_kernel(kernel, be.kernel_copy) for be in (shared, a, b, again)]
    assert shared.kernel_copy is None and load_kernel(kernel) is jits[0]
    assert len({id(j) for j in jits[:3]}) == 3 and jits[3] is jits[2]
    assert all(j.fn.__code__.co_code == jits[0].fn.__code__.co_code for j in jits)


def test_a_wrong_candidate_is_never_kept():
    """The acceptance check on real outputs: a result off by more than the dtype's tolerance is
    rejected, one within it accepted (on a GPU, tf32 for an f32 GEMM is such a candidate:
    tests/gpu)."""
    from pto.cli.commands.tune import accept

    g = torch.Generator().manual_seed(0)
    ref = {"c": torch.randn(64, 64, generator=g)}
    close = {"c": ref["c"] * (1 + 1e-7)}
    off = {"c": ref["c"].clone()}
    off["c"][3, 5] += 0.05 * ref["c"].norm()  # one element badly wrong
    assert accept(close, ref, "f32") is not None
    assert accept(off, ref, "f32") is None and accept(off, ref, "bf16") is None
    nan = {"c": ref["c"].clone()}
    nan["c"][0, 0] = float("nan")
    assert accept(nan, ref, "bf16") is None


@pytest.mark.slow
def test_tune_refuses_without_a_gpu_and_show_reports_the_origin():
    r = subprocess.run([sys.executable, "-m", "pto.cli", "tune", "softmax"], capture_output=True, text=True)
    if not torch.cuda.is_available():
        assert r.returncode == 2 and "pto tune measures kernels on a GPU and none is visible" in r.stderr
    r = subprocess.run([sys.executable, "-m", "pto.cli", "tune", "softmax", "--show", "--seq", "100"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "schedules for" in r.stdout and "softmax_tile__" in r.stdout and "heuristic" in r.stdout


def test_launch_settings_are_typed_and_name_where_a_bad_one_came_from():
    """A schedule's or an override's keys: Triton's launch keywords, GROUP, the code-generation
    options, and Triton's maxnreg and num_ctas passed through; anything else is one error naming
    its source."""
    from pto.backends.triton import LaunchConfig, merged
    from pto.errors import UsageError

    c = LaunchConfig.of({"num_warps": 8, "GROUP": 4, "maxnreg": 128, "input_precision": "tf32"})
    assert c.kwargs() == {"num_warps": 8, "num_stages": 1, "enable_fp_fusion": False, "maxnreg": 128, "GROUP": 4}
    assert dict(c)["input_precision"] == "tf32" and c == {**c.kwargs(), "input_precision": "tf32"}
    assert merged([c, LaunchConfig(num_warps=4, enable_fp_fusion=True)]).kwargs() == {
        "num_warps": 8, "num_stages": 1, "enable_fp_fusion": True}
    with pytest.raises(UsageError, match="the user schedule of v: unknown launch setting 'warps'"):
        LaunchConfig.of({"warps": 8}, "the user schedule of v")


def test_the_old_keywords_of_tune_and_bench_say_where_they_went():
    from pto.cli.commands.bench import bench
    from pto.cli.commands.tune import tune
    from pto.errors import UsageError

    with pytest.raises(UsageError, match=r"tune: budget_s go in search=Search\(...\)"):
        tune("bgemm", [40], budget_s=1, device="cpu")
    with pytest.raises(UsageError, match=r"bench: iterations go in timing=Timing\(...\)"):
        bench("softmax", [64], iterations=2, device="cpu")


def test_the_tuner_tries_persistent_tile_loops_only_on_kernels_that_multiply_large_tiles_in_a_loop():
    """The search space adds the persistent tile loops (at 8 warps, 3 stages, every grouped order)
    for a GEMM whose K loop loads large tiles, where the kernels are compiled (warp-specialized
    from compute capability 9.0); never for a kernel without such a loop, nor under the
    interpreter."""
    from pto.incore.matmul import matmul_tile
    from pto.incore.norm import rmsnorm_tile

    from pto import bf16
    from pto.cli.commands.tune import space
    from pto.ir.analysis import specialize

    gemm = specialize(matmul_tile(bf16, 128, 4096, 4096, 256, 64), {"R": 128, "K": 4096, "N": 4096})
    plain = space(gemm)
    assert len(plain) == 24 and not any("persistent" in c for c in plain)
    hopper = space(gemm, (9, 0))
    extra = [c for c in hopper if "persistent" in c]
    assert hopper[:24] == plain and len(extra) == 8
    assert {c["persistent"] for c in extra} == {"loop", "ws"}
    assert {(c["num_warps"], c["num_stages"]) for c in extra} == {(8, 3)}
    assert {c["persistent"] for c in space(gemm, (8, 0)) if "persistent" in c} == {"loop"}
    norm = specialize(rmsnorm_tile(4096, bf16, 128, 2, 4096))
    assert not any("persistent" in c for c in space(norm, (9, 0)))


def test_pto_persistent_loops_the_kernels_that_multiply_large_tiles_unless_a_schedule_says(monkeypatch):
    from pto.incore.decode import decode_attn_combine_parts
    from pto.incore.gemv import gemv_residual_tile
    from pto.incore.matmul import matmul_tile
    from pto.incore.norm import rmsnorm_tile

    from pto import bf16
    from pto.backends.triton import TritonBackend
    from pto.errors import UsageError
    from pto.ir.analysis import specialize

    gemm = specialize(matmul_tile(bf16, 128, 4096, 4096, 256, 64), {"R": 128, "K": 4096, "N": 4096})
    norm = specialize(rmsnorm_tile(4096, bf16, 128, 2, 4096))
    monkeypatch.setenv("PTO_PERSISTENT", "loop")
    be = TritonBackend("cpu")
    assert be.render_options(gemm, be.launch_config(gemm)).persistent == "loop"
    assert be.render_options(norm, be.launch_config(norm)).persistent == ""
    off = TritonBackend("cpu", launch={"matmul_tile": {"persistent": ""}})
    assert off.render_options(gemm, off.launch_config(gemm)).persistent == ""
    monkeypatch.setenv("PTO_PERSISTENT", "flat")  # also the kernels with a parallel axis (the GEMVs)
    flat = TritonBackend("cpu")
    gemv = specialize(gemv_residual_tile(bf16, 1, 4096, 4096, 8, 2048))
    combine = decode_attn_combine_parts(bf16, 32, 128, 8)  # (no parallel axis)
    assert [flat.render_options(f, flat.launch_config(f)).persistent for f in (gemm, gemv, norm, combine)] == \
        ["flat", "flat", "flat", ""]
    assert be.render_options(gemv, be.launch_config(gemv)).persistent == ""
    monkeypatch.setenv("PTO_PERSISTENT", "blocks")  # the kernels with a parallel axis, a loop of their blocks
    blocks = TritonBackend("cpu")
    assert [blocks.render_options(f, blocks.launch_config(f)).persistent for f in (gemm, gemv, norm, combine)] == \
        ["blocks", "blocks", "blocks", ""]
    from pto.backends.triton.modes import persistent_mode

    monkeypatch.delenv("PTO_PERSISTENT")  # the default, "auto": the 4-bit gate/up GEMVs (test_block_loop.py)
    assert persistent_mode() == "auto" and TritonBackend("cpu").persistent == "auto"
    for off in ("off", ""):
        monkeypatch.setenv("PTO_PERSISTENT", off)
        none = TritonBackend("cpu")
        assert persistent_mode() == "" and none.render_options(gemv, none.launch_config(gemv)).persistent == ""
    monkeypatch.setenv("PTO_PERSISTENT", "spin")
    with pytest.raises(UsageError, match=r"PTO_PERSISTENT='spin': one of auto, loop, ws, flat, blocks or off"):
        TritonBackend("cpu")


@pytest.mark.parametrize("mode,early", [("loop", ("w",)), ("ws", ())])
def test_a_warp_specialized_loop_loads_nothing_before_its_wait(mode, early):
    """Under the "auto" PDL policy a batch's kernel loads what the previous launch does not
    write (here the weight) before its wait; a warp-specialized persistent loop keeps the wait
    before the loop instead (what Triton's partitions do around an inline wait is unchecked)."""
    from pto.incore.matmul import matmul_tile

    from pto import bf16
    from pto.backends.triton import TritonBackend
    from pto.data.batch import RegionBatch, TaskBatch
    from pto.ir.analysis import specialize

    gemm = specialize(matmul_tile(bf16, 128, 4096, 4096, 256, 64), {"R": 128, "K": 4096, "N": 4096})
    be = TritonBackend("cpu", launch={"matmul_tile": {"persistent": mode}})
    be.pdl = "auto"  # the policy of a GPU of compute capability 9.0 (refused on the CPU)
    one = torch.zeros(1, dtype=torch.int64)
    mems = {p.name: RegionBatch(torch.empty(1, 1), one, one, one + 1, one + 1) for p in gemm.memrefs}
    batch = TaskBatch(gemm, mems, {}, 1, frozenset({"w"}))
    opts = be.batch_options(be.launch_config(gemm), batch)
    assert opts.persistent == mode and opts.pre == early
