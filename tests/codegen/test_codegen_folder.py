"""``pto codegen --out DIR`` owns its folder (pto/cli/commands/codegen.py): a folder holding files pto did not
write is refused (one line naming it and --force), pto's own earlier output is replaced whole (no
stale kernel of another configuration, no stale ``graph`` binary), ``--force`` writes over the
rest and keeps it, and a codegen that fails leaves the folder as it was."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from pto.cli.commands.codegen import MANIFEST, write


def codegen(out, *args):
    return subprocess.run([sys.executable, "-m", "pto.cli", "codegen", "llama7b", "--out", str(out),
                           "--target", "x86_64", *args], capture_output=True, text=True, timeout=300)


def files(folder) -> set[str]:
    return {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}


def refused(r, folder) -> str:
    assert r.returncode == 2 and r.stdout == "", r.stderr
    err = r.stderr.strip()
    assert "\n" not in err and err.startswith(f"pto: error: --out {folder}: holds files") and "--force" in err
    return err


@pytest.mark.slow
def test_a_folder_pto_did_not_write_is_refused_and_force_keeps_the_rest(tmp_path):
    gen = tmp_path / "gen"
    gen.mkdir()
    (gen / "llama7b.c").write_text("mine\n")
    (gen / "notes.txt").write_text("keep\n")
    err = refused(codegen(gen), gen)
    assert "pto did not write (llama7b.c, notes.txt)" in err
    assert (gen / "llama7b.c").read_text() == "mine\n" and files(gen) == {"llama7b.c", "notes.txt"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gen"]  # nothing written beside it
    r = codegen(gen, "--force")
    assert r.returncode == 0, r.stderr
    assert (gen / "llama7b.c").read_text() != "mine\n" and (gen / "notes.txt").read_text() == "keep\n"
    listed = json.loads((gen / MANIFEST).read_text())["files"]
    assert files(gen) == set(listed) | {MANIFEST, "notes.txt"}
    refused(codegen(gen), gen)  # notes.txt is still not pto's


@pytest.mark.slow
def test_pto_output_is_replaced_whole(tmp_path):
    """7b's kernels, then tiny's: the folder holds exactly what a fresh codegen of tiny writes,
    and the binary built from 7b's sources is gone with them."""
    gen, fresh = tmp_path / "gen", tmp_path / "fresh"
    assert codegen(gen, "--config", "7b", "--dtype", "bf16", "--target", "cuda_h100").returncode == 0
    seven = files(gen)
    (gen / "graph").write_bytes(b"\x7fELF built from 7b's sources")  # what README's cc line makes
    r = codegen(gen, "--config", "tiny")
    assert r.returncode == 0, r.stderr
    assert codegen(fresh, "--config", "tiny").returncode == 0
    assert files(gen) == files(fresh) != seven
    assert "graph" not in files(gen)
    assert {(p.name, p.read_bytes()) for p in gen.rglob("*") if p.is_file()} == \
        {(p.name, p.read_bytes()) for p in fresh.rglob("*") if p.is_file()}
    assert r.stdout.split() == [str(gen / f) for f in json.loads((gen / MANIFEST).read_text())["files"]] + \
        [str(gen / MANIFEST)]


def test_a_changed_file_of_pto_is_refused(tmp_path):
    gen = tmp_path / "gen"
    assert codegen(gen).returncode == 0
    with open(gen / "main.c", "a") as f:
        f.write("/* my change */\n")
    assert "holds files changed since pto wrote them (main.c)" in refused(codegen(gen), gen)
    assert (gen / "main.c").read_text().endswith("/* my change */\n")


def test_an_empty_folder_is_written(tmp_path):
    r = codegen(tmp_path)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / MANIFEST).is_file() and (tmp_path / "llama7b.c").is_file()


@pytest.mark.parametrize("exists", [False, True])
def test_a_failed_write_leaves_the_folder_as_it_was(tmp_path, exists):
    """The output goes to a temporary sibling first: a failure there (here a file and a folder of
    the same name) leaves no part of it, in the folder or beside it."""
    gen = tmp_path / "gen"
    if exists:
        write(str(gen), {"a.c": b"old\n"})
    before = {p: p.read_bytes() for p in gen.rglob("*") if p.is_file()} if exists else None
    with pytest.raises(OSError):
        write(str(gen), {"a.c": b"new\n", "kernels": b"a file", "kernels/k.py": b"in a folder"})
    assert sorted(p.name for p in tmp_path.iterdir()) == (["gen"] if exists else [])
    if exists:
        assert {p: p.read_bytes() for p in gen.rglob("*") if p.is_file()} == before
