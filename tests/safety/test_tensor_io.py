"""User tensors in and out: ``pto run --inputs FILE`` runs on the file's tensors (the same bits
as the seeded run they were saved from, and the reference check uses them), ``--save FILE``
writes the outputs and the run's settings; every mismatch between the file and the program is
one line on stderr with exit 2, before anything runs."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from pto.engine import resolve
from pto.errors import UsageError
from pto.safety.tensor_io import load_inputs, program_inputs


def _pto(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "pto.cli", *args], capture_output=True, text=True, timeout=timeout)


def _llama(seq=48):
    job = resolve("llama7b", device="cpu", options={"attention": "pair"})
    return job, job.program.build(job.settings), job.program.scalars(job.settings, job.program.shape(seq))


def test_inputs_from_a_file_and_outputs_to_one(tmp_path):
    """Seeded inputs written to a file, run from it: the saved outputs are the seeded run's
    bits, and --check compares with the reference on the file's tensors."""
    job, _, _ = _llama()
    x = job.program.inputs(job.settings, job.program.shape(48), "cpu", seed=5)
    x["x"] = x["x"] * 3  # not what seed 5 gives: the run must really read the file
    save_file(x, str(tmp_path / "in.safetensors"))
    r = _pto("run", "llama7b", "--seq", "48", "--device", "cpu", "--attention", "pair", "--inputs",
             str(tmp_path / "in.safetensors"), "--save", str(tmp_path / "out.safetensors"), "--check", "--json")
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert res["rel_err"] <= 1e-4 and res["inputs"].endswith("in.safetensors")
    got = load_file(str(tmp_path / "out.safetensors"))
    assert set(got) == {"y"}
    ref = job.program.reference(job.settings, job.program.shape(48), x)["y"]
    torch.testing.assert_close(got["y"], ref, rtol=1e-4, atol=1e-4)
    with safe_open(str(tmp_path / "out.safetensors"), "pt") as f:
        meta = f.metadata()
    assert meta["program"] == "llama7b" and meta["seq"] == "48" and meta["attention"] == "pair"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary left


def test_saved_outputs_equal_the_in_process_run_bit_for_bit(tmp_path):
    job, module, scalars = _llama(40)
    r = _pto("run", "llama7b", "--seq", "40", "--device", "cpu", "--attention", "pair", "--seed", "3", "--save",
             str(tmp_path / "y.safetensors"))
    assert r.returncode == 0, r.stderr
    from pto.engine import Runner

    runner = Runner(job, 40)
    want = runner(job.program.inputs(job.settings, job.program.shape(40), "cpu", seed=3))["y"]
    assert torch.equal(load_file(str(tmp_path / "y.safetensors"))["y"], want)
    runner.close()


def _write(path, tensors):
    save_file(tensors, str(path))
    return str(path)


@pytest.mark.slow
@pytest.mark.parametrize("case,needle", [
    ("unknown", "tensor `bogus` is not an input of llama7b"),
    ("missing", "no tensor for the inputs `wq`, `cos` of llama7b"),
    ("shape", "tensor `x` is 47x256 but llama7b at seq 48 (config tiny) takes 48x256"),
    ("int", "tensor `g_attn` is I32, not a floating-point type"),
    ("garbage", "not a readable safetensors file"),
    ("truncated", "not a readable safetensors file (Error while deserializing header"),
    ("absent", "no such file"),
])
def test_each_mismatch_is_one_clear_error(tmp_path, case, needle):
    job, module, scalars = _llama()
    x = job.program.inputs(job.settings, job.program.shape(48), "cpu")
    path = tmp_path / "in.safetensors"
    if case == "unknown":
        x["bogus"] = torch.zeros(2, 2)
    elif case == "missing":
        del x["wq"], x["cos"]
    elif case == "shape":
        x["x"] = x["x"][:47].contiguous()
    elif case == "int":
        x["g_attn"] = x["g_attn"].to(torch.int32)
    if case == "garbage":
        path.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not json at all!")
    elif case == "truncated":
        _write(path, x)
        path.write_bytes(path.read_bytes()[:-1000])
    elif case != "absent":
        _write(path, x)
    with pytest.raises(UsageError) as err:
        load_inputs(str(path), module, scalars, "cpu", program="llama7b at seq 48 (config tiny)")
    msg = str(err.value)
    assert needle in msg and "\n" not in msg and msg.startswith(f"--inputs {path}")
    r = _pto("run", "llama7b", "--seq", "48", "--device", "cpu", "--attention", "pair", "--inputs", str(path))
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("pto: error: --inputs") and needle in r.stderr


def test_other_float_dtypes_are_converted(tmp_path):
    job, module, scalars = _llama()
    x = job.program.inputs(job.settings, job.program.shape(48), "cpu")
    path = _write(tmp_path / "in.safetensors", {k: v.double() for k, v in x.items()})
    got = load_inputs(path, module, scalars, "cpu")
    assert set(got) == set(program_inputs(module, scalars)) == set(x)
    assert all(got[k].dtype == torch.float32 and torch.equal(got[k], x[k]) for k in x)


def test_save_checks_its_path_before_running(tmp_path):
    r = _pto("run", "softmax", "--device", "cpu", "--save", str(tmp_path / "no" / "y.safetensors"))
    assert r.returncode == 2 and "--save" in r.stderr and "does not exist" in r.stderr
    r = _pto("run", "softmax", "--device", "cpu", "--save", str(tmp_path / "a"), "--trace", str(tmp_path / "a"))
    assert r.returncode == 2 and "the same file" in r.stderr


@pytest.mark.slow
def test_save_inputs_round_trip(tmp_path):
    """--save-inputs writes the seeded inputs as --inputs takes them: running from the file gives
    the seeded run's outputs, bit for bit, and the same rel_err."""
    a, y1, y2 = (str(tmp_path / n) for n in ("a.safetensors", "y1.safetensors", "y2.safetensors"))
    common = ("run", "llama7b", "--seq", "40", "--device", "cpu", "--attention", "pair", "--check", "--json")
    r1 = _pto(*common, "--seed", "7", "--save-inputs", a, "--save", y1)
    assert r1.returncode == 0, r1.stderr
    assert json.loads(r1.stdout)["saved_inputs"] == a
    job, module, scalars = _llama(40)
    saved = load_file(a)
    want = {k: shape for k, (shape, _) in program_inputs(module, scalars).items()}
    assert {k: tuple(v.shape) for k, v in saved.items()} == want
    seeded = job.program.inputs(job.settings, job.program.shape(40), "cpu", seed=7)
    assert all(torch.equal(saved[k], seeded[k]) for k in saved)
    r2 = _pto(*common, "--inputs", a, "--save", y2)
    assert r2.returncode == 0, r2.stderr
    assert json.loads(r2.stdout)["rel_err"] == json.loads(r1.stdout)["rel_err"]
    assert torch.equal(load_file(y1)["y"], load_file(y2)["y"])


@pytest.mark.slow
def test_identical_runs_write_identical_files(tmp_path):
    """No timing or other run-dependent value in the files' metadata, and the metadata in one
    order: two identical runs (two processes) write the same bytes."""
    paths = []
    for i in (1, 2):
        y, a = tmp_path / f"y{i}.safetensors", tmp_path / f"a{i}.safetensors"
        r = _pto("run", "llama7b", "--seq", "40", "--device", "cpu", "--attention", "pair", "--save", str(y),
                 "--save-inputs", str(a))
        assert r.returncode == 0, r.stderr
        paths.append((y, a))
    (y1, a1), (y2, a2) = paths
    assert y1.read_bytes() == y2.read_bytes() and a1.read_bytes() == a2.read_bytes()
    with safe_open(str(y1), "pt") as f:
        meta = f.metadata()
    assert (meta["program"], meta["seq"], meta["config"], meta["dtype"], meta["seed"]) == \
        ("llama7b", "40", "tiny", "f32", "0")
    assert not any(k.endswith("_ms") or k in ("tasks", "launches", "waves", "determinism") for k in meta), meta


def test_save_inputs_is_checked_before_running(tmp_path):
    r = _pto("run", "softmax", "--device", "cpu", "--save-inputs", str(tmp_path / "no" / "a.safetensors"))
    assert r.returncode == 2 and r.stderr.startswith("pto: error: --save-inputs") and "does not exist" in r.stderr
    r = _pto("run", "softmax", "--device", "cpu", "--save-inputs", str(tmp_path / "a"), "--save", str(tmp_path / "a"))
    assert r.returncode == 2 and "the same file" in r.stderr
