"""bench/ship_schedules.py: a tuned database folder merged into the shipped schedules (entries of
the same variant, bucket and kernel source replaced, others added, the rest kept), and a folder
that is not one device's database refused with one line before anything is written."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from pto.backends.triton.schedules import Entry, ScheduleDB, device_key

_path = Path(__file__).resolve().parents[2] / "bench" / "ship_schedules.py"
_spec = importlib.util.spec_from_file_location("ship", _path)
ship = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ship)

H200 = "NVIDIA H200"


def _entry(variant: str, bucket: str, warps: int, source: str = "s1") -> Entry:
    return Entry(variant, bucket, {"num_warps": warps}, "3.6.0", source, ms=1.0, measured="test")


def test_a_tuned_folder_merges_into_the_shipped_one(tmp_path):
    shipped = ScheduleDB(H200, user_dir=tmp_path / "shipped")
    shipped.store("matmul_tile", _entry("mm", "small", 4))
    shipped.store("matmul_tile", _entry("mm", "large", 4))
    shipped.store("rope_tile", _entry("rope", "small", 2))
    tuned = ScheduleDB(H200, user_dir=tmp_path / "tuned")
    tuned.store("matmul_tile", _entry("mm", "small", 8))  # replaces
    tuned.store("matmul_tile", _entry("mm", "small", 2, source="s2"))  # another kernel source: joins
    tuned.store("flash_fused", _entry("fa", "medium", 8))  # a new file
    lines = ship.ship(tmp_path / "tuned" / device_key(H200), tmp_path / "shipped")
    # (by function, then in the file's order: variant, bucket, kernel source)
    assert [line.split()[:3] for line in lines] == [["added", "fa", "medium"], ["replaced", "mm", "small"],
                                                    ["added", "mm", "small"]]
    got = {f: {(e.variant, e.bucket, e.source): e.params["num_warps"] for e in shipped.entries(f)}
           for f in ("matmul_tile", "rope_tile", "flash_fused")}
    assert got == {"matmul_tile": {("mm", "small", "s1"): 8, ("mm", "small", "s2"): 2, ("mm", "large", "s1"): 4},
                   "rope_tile": {("rope", "small", "s1"): 2}, "flash_fused": {("fa", "medium", "s1"): 8}}
    before = {p.name: p.read_text() for p in (tmp_path / "shipped" / device_key(H200)).glob("*.json")}
    ship.ship(tmp_path / "tuned" / device_key(H200), tmp_path / "shipped")  # again: nothing changes
    assert {p.name: p.read_text() for p in (tmp_path / "shipped" / device_key(H200)).glob("*.json")} == before


def test_what_is_not_one_devices_database_is_refused_before_writing(tmp_path, capsys):
    into = tmp_path / "shipped"
    empty = tmp_path / "empty"
    empty.mkdir()
    mixed = tmp_path / "mixed"
    ScheduleDB(H200, user_dir=tmp_path / "a").store("matmul_tile", _entry("mm", "small", 8))
    ScheduleDB("NVIDIA H100 80GB HBM3", user_dir=tmp_path / "b").store("rope_tile", _entry("rope", "small", 2))
    mixed.mkdir()
    for src in ((tmp_path / "a" / device_key(H200)), (tmp_path / "b" / "nvidia_h100_80gb_hbm3")):
        for f in src.glob("*.json"):
            (mixed / f.name).write_text(f.read_text())
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "matmul_tile.json").write_text(json.dumps({"format": 1, "device": H200}))
    for folder, why in ((tmp_path / "nowhere", "no schedule files"), (empty, "no schedule files"),
                        (mixed, "files of 2 devices"), (broken, "not a schedule database file")):
        with pytest.raises(SystemExit, match=rf"^ship_schedules: {folder}.*{why}"):
            ship.main([str(folder), "--into", str(into)])
    assert not into.exists()


def test_a_tar_archive_of_the_tuned_folder_ships_as_the_folder_does(tmp_path):
    """The tune stage's ``schedules_<device>.tar.gz`` (the folder inside it) merges as the folder
    itself; an archive of nothing, a file that is no archive, a member that is no database file
    (named) or two of one function is one line before any write."""
    import tarfile

    tuned = ScheduleDB(H200, user_dir=tmp_path / "tuned")
    tuned.store("matmul_tile", _entry("mm", "small", 8))
    tuned.store("rope_tile", _entry("rope", "large", 2))
    archive = tmp_path / "schedules_nvidia_h200.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(tmp_path / "tuned" / device_key(H200), arcname=device_key(H200))
    from_folder = ship.ship(tmp_path / "tuned" / device_key(H200), tmp_path / "a")
    from_archive = ship.ship(archive, tmp_path / "b")
    assert [line.split()[:3] for line in from_archive] == [line.split()[:3] for line in from_folder] == [
        ["added", "mm", "small"], ["added", "rope", "large"]]
    files = {p.name: p.read_text() for p in (tmp_path / "a" / device_key(H200)).glob("*.json")}
    assert {p.name: p.read_text() for p in (tmp_path / "b" / device_key(H200)).glob("*.json")} == files
    empty = tmp_path / "empty.tar.gz"
    with tarfile.open(empty, "w:gz"):
        pass
    not_tar = tmp_path / "notes.txt"
    not_tar.write_text("not an archive")
    bad = tmp_path / "bad.tar.gz"  # a member that is not text: named
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "rope_tile.json").write_bytes(b"\xff\xfe")
    twice = tmp_path / "twice.tar.gz"  # two folders' files of one function: refused, not one dropped
    with tarfile.open(bad, "w:gz") as tar:
        tar.add(tmp_path / "bad", arcname="bad")
    with tarfile.open(twice, "w:gz") as tar:
        tar.add(tmp_path / "tuned" / device_key(H200), arcname="a")
        tar.add(tmp_path / "tuned" / device_key(H200), arcname="b")
    into = tmp_path / "c"
    for source, why in ((empty, "no schedule files"), (not_tar, "not a folder or a tar archive"),
                        (bad, "bad/rope_tile.json: not a schedule database file"),
                        (twice, "b/matmul_tile.json: a second file of matmul_tile")):
        with pytest.raises(SystemExit, match=rf"^ship_schedules: {source}.*{why}"):
            ship.main([str(source), "--into", str(into)])
    assert not into.exists()
