"""Faults that must leave nothing broken, each in real processes on a private cache folder
($PTO_CACHE_DIR): a compiled runtime module truncated, altered in place, without its module or
its checksum; a generated C source or a Triton kernel source truncated or overwritten with
garbage; a schedule database file that is not JSON: each is detected, rebuilt (or set aside)
and reported on one stderr line, and the run gives the same bits as before. Two processes
compiling the same cache entry at the same moment both succeed. Ctrl-C during a run exits 130
with one line. (The GPU's out-of-memory refusal and Ctrl-C during a GPU run are in
tests/gpu/test_safety_gpu.py.)"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file

from tests.safety import programs

pytestmark = pytest.mark.timeout(600)


def _pto(cache: Path, *args, env=None, timeout=300):
    e = {**os.environ, "PTO_CACHE_DIR": str(cache), **(env or {})}
    return subprocess.run([sys.executable, "-m", "pto.cli", *args], capture_output=True, text=True, env=e,
                          timeout=timeout)


def _run_ok(cache: Path, out: Path, *extra, env=None):
    """pto run bgemm saving its output, on the torch backend (the bare runtime's module and the
    program's: the c backend's kernel modules have their own cache, pto.cache.cbuild's as well);
    returns (stderr, output)."""
    r = _pto(cache, "run", "bgemm", "--device", "cpu", "--backend", "torch", "--seq", "40", "--save", str(out),
             *extra, env=env)
    assert r.returncode == 0, r.stderr
    return r.stderr, load_file(str(out))["C"]


def _cache_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("pto: cache:")]


def _modules(cache: Path) -> list[Path]:
    return sorted(cache.glob("cffi/*/*.so"))  # the bare runtime's and the program's


WHY = {"truncated": "corrupt", "flipped": "corrupt", "no-module": "missing its module"}


def _damage(m: Path, how: str) -> None:
    if how == "truncated":
        m.write_bytes(m.read_bytes()[: m.stat().st_size // 2])
    elif how == "flipped":  # same size, one byte changed
        data = bytearray(m.read_bytes())
        data[len(data) // 2] ^= 0xFF
        m.write_bytes(bytes(data))
    elif how == "no-checksum":
        (m.parent / "sha256").unlink()
    else:
        m.unlink()


@pytest.mark.slow
@pytest.mark.parametrize("damages", [("truncated", "flipped"), ("no-module", "no-checksum")], ids="+".join)
def test_a_damaged_compiled_module_is_rebuilt_and_reported(tmp_path, damages):
    """The bare runtime's module and the program's, each damaged one way."""
    cache = tmp_path / "cache"
    _, want = _run_ok(cache, tmp_path / "a.safetensors")
    mods = _modules(cache)
    assert len(mods) == 2 and all((m.parent / "sha256").is_file() for m in mods)
    for m, how in zip(mods, damages):
        _damage(m, how)
    err, got = _run_ok(cache, tmp_path / "b.safetensors")
    # an older pto's entry (no checksum) is rebuilt without a word
    want_lines = sorted(f"pto: cache: the compiled module {m.parent} was {WHY[how]}"
                        for m, how in zip(mods, damages) if how != "no-checksum")
    lines = sorted(_cache_lines(err))
    assert [line.split(" (")[0].split("; ")[0] for line in lines] == want_lines, err
    assert all(line.endswith("; rebuilt") for line in lines) and "Traceback" not in err
    assert got.equal(want)
    assert _modules(cache) == mods and all(m.read_bytes() for m in mods)
    assert not list(cache.glob("cffi/.bad-*")) and not list(cache.glob("cffi/.build-*"))
    err, _ = _run_ok(cache, tmp_path / "c.safetensors")
    assert _cache_lines(err) == []  # repaired for good


@pytest.mark.slow
def test_a_damaged_generated_source_is_rewritten_and_reported(tmp_path):
    cache = tmp_path / "cache"
    _, want = _run_ok(cache, tmp_path / "a.safetensors")
    (src,) = cache.glob("src/*.c")
    text = src.read_bytes()
    src.write_bytes(text[: len(text) // 3])
    err, got = _run_ok(cache, tmp_path / "b.safetensors")
    assert _cache_lines(err) == [f"pto: cache: the generated source {src} was corrupt; rewritten"]
    assert src.read_bytes() == text and got.equal(want)


needs_interp = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs the Triton interpreter")


@pytest.mark.slow
@needs_interp
@pytest.mark.parametrize("damage", ["truncated", "garbage"])
def test_a_damaged_triton_source_is_rewritten_and_reported(tmp_path, damage):
    cache = tmp_path / "cache"
    env = {"TRITON_INTERPRET": "1"}
    args = ("--backend", "triton", "--executor", "persistent")
    _, want = _run_ok(cache, tmp_path / "a.safetensors", *args, env=env)
    sources = sorted(cache.glob("triton/*.py"))
    assert sources
    texts = {p: p.read_bytes() for p in sources}
    for p in sources:
        p.write_bytes(texts[p][:100] if damage == "truncated" else b"\xff\xfe not python \x00\x01")
    err, got = _run_ok(cache, tmp_path / "b.safetensors", *args, env=env)
    lines = _cache_lines(err)
    assert len(lines) == len(sources) and all("the Triton source" in x and x.endswith("; rewritten") for x in lines)
    assert all(p.read_bytes() == texts[p] for p in sources) and got.equal(want)
    assert not (cache / "triton" / "__pycache__").exists()  # no bytecode to go stale or corrupt


@pytest.mark.slow
@needs_interp
def test_a_corrupt_schedule_database_is_set_aside_and_reported(tmp_path):
    """The schedule database (pto.backends.triton.schedules) keeps the user's launch parameters
    as JSON under the cache folder; a file that does not parse is moved aside, reported, and the
    run goes on with the defaults."""
    from pto.backends.triton.schedules import device_key

    cache = tmp_path / "cache"
    env = {"TRITON_INTERPRET": "1"}
    _, want = _run_ok(cache, tmp_path / "a.safetensors", "--backend", "triton", env=env)
    folder = cache / "schedules" / device_key("cpu")
    folder.mkdir(parents=True)
    bad = folder / "gemm_tile.json"
    bad.write_text('{"format": 1, "entries": [{"variant": "gemm_tile__TK2')  # truncated mid-write
    err, got = _run_ok(cache, tmp_path / "b.safetensors", "--backend", "triton", env=env)
    assert "schedule database" in err and "corrupt" in err and "Traceback" not in err
    assert not bad.exists() and (folder / "gemm_tile.json.corrupt").is_file()
    assert got.equal(want)
    err, _ = _run_ok(cache, tmp_path / "c.safetensors", "--backend", "triton", env=env)
    assert "corrupt" not in err


_RACE = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    go = Path(sys.argv[1])
    while not go.exists():
        time.sleep(0.001)
    from pto.cache.cbuild import load_cffi_module
    src = "int pto_race_add(int a, int b) { return a + b + %d; }\\n"
    mod = load_cffi_module("race", "int pto_race_add(int a, int b);", src % int(sys.argv[2]))
    print(mod.lib.pto_race_add(2, 3))
""")


def test_two_processes_compiling_one_entry_at_once_both_succeed(tmp_path):
    """Both processes wait for the same file, then build the same new module: each loads the
    module it built, one entry ends in the cache, complete and with its checksum."""
    cache, go = tmp_path / "cache", tmp_path / "go"
    script = tmp_path / "race.py"
    script.write_text(_RACE)
    env = {**os.environ, "PTO_CACHE_DIR": str(cache)}
    procs = [subprocess.Popen([sys.executable, str(script), str(go), "40"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env) for _ in range(2)]
    time.sleep(3)  # both are waiting (importing pto happens after the start)
    go.touch()
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[1] for o in outs]
    assert [o[0].strip() for o in outs] == ["45", "45"]
    entries = [p for p in (cache / "cffi").iterdir()]
    assert len(entries) == 1 and (entries[0] / "sha256").is_file() and len(list(entries[0].glob("*.so"))) == 1
    r = subprocess.run([sys.executable, str(script), str(go), "40"], capture_output=True, text=True, env=env,
                       timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "45" and "pto: cache" not in r.stderr


@pytest.mark.slow
@needs_interp
def test_two_runs_on_a_fresh_cache_at_once_both_succeed(tmp_path):
    """Two whole `pto run` processes compile the same runtime, orchestration and Triton kernels
    into one empty cache at the same time."""
    cache = tmp_path / "cache"
    env = {**os.environ, "PTO_CACHE_DIR": str(cache), "TRITON_INTERPRET": "1"}
    cmd = [sys.executable, "-m", "pto.cli", "run", "softmax", "--device", "cpu", "--backend", "triton", "--json",
           "--save"]
    procs = [subprocess.Popen([*cmd, str(tmp_path / f"{k}.safetensors")], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env) for k in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[1] for o in outs]
    assert all("pto: cache" not in o[1] for o in outs)
    a, b = (load_file(str(tmp_path / f"{k}.safetensors"))["y"] for k in range(2))
    assert a.equal(b) and json.loads(outs[0][0])["tasks"] == json.loads(outs[1][0])["tasks"]


@pytest.mark.slow
@pytest.mark.parametrize("extra", [(), pytest.param(("--backend", "triton", "--executor", "persistent"),
                                                    marks=needs_interp)], ids=["torch-waves", "triton-persistent"])
def test_ctrl_c_during_a_run_exits_cleanly(tmp_path, extra):
    """SIGINT while the replays run: exit 130, one line on stderr, no file half-written."""
    dump, save = tmp_path / "graph.txt", tmp_path / "y.safetensors"
    # SIGINT as a terminal gives it (programs.interruptible); the child killed whatever happens
    with subprocess.Popen([sys.executable, "-m", "pto.cli", "run", "llama7b", "--device", "cpu", "--seq", "40",
                           "--repeat", "1000000", "--dump", str(dump), "--save", str(save), *extra],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          preexec_fn=programs.interruptible) as proc:
        try:
            deadline = time.monotonic() + 240
            while not dump.exists() and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            assert dump.exists(), proc.communicate()[1]
            time.sleep(1.0)  # inside the replays
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=120)
        finally:
            proc.kill()
    assert proc.returncode == 130 and err == "pto: interrupted\n" and out == "", err
    # the first run's outputs are saved before the replays, if it got that far: complete, and no
    # temporary left either way
    assert {p.name for p in tmp_path.iterdir()} <= {"graph.txt", "y.safetensors"}
    assert not save.exists() or load_file(str(save))["y"].shape == (40, 256)
