"""Ship what ``pto tune`` found on a device: merge a tuned database folder (the ``tune`` stage of
bench/gpu_session.sh archives it to ``$OUT/schedules_<device>.tar.gz``) into a program's shipped
schedules (``orchestration/llama/schedules/<device>/`` by default), one line per entry.

    python bench/ship_schedules.py FOLDER_OR_ARCHIVE [--into orchestration/llama/schedules]

FOLDER_OR_ARCHIVE is the folder, or a tar archive of it (``schedules_<device>.tar.gz``, as the
``tune`` stage writes it: a device call returns at most 8 files, fewer than a tuned folder holds).

Each entry is stored as ``pto tune`` stores it (``ScheduleDB.store``): it replaces the shipped
entry of the same variant, bucket and kernel source, or joins the file. The device is the one
the folder's files name; a folder of several devices, or of files that are not a database, is
refused with one line before anything is written. Then run
``python -m pytest tests/schedules`` (every shipped entry must match today's kernels). A new
device's folder is also a package to list in pyproject.toml (``packages`` and ``package-data``;
tests/test_packaging.py checks)."""

from __future__ import annotations

import argparse
import json
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pto.backends.triton.schedules import FORMAT, Entry, ScheduleDB  # noqa: E402


def _files(source: Path) -> list[tuple[str, bytes]]:
    """``(name, bytes)`` of the ``*.json`` files of a folder, or of a tar archive's regular files
    (any folder inside it), sorted by name; ValueError where ``source`` is neither."""
    if source.is_dir():
        return [(str(f), f.read_bytes()) for f in sorted(source.glob("*.json"))]
    if source.is_file():
        try:
            with tarfile.open(source) as tar:
                members = sorted((m for m in tar.getmembers() if m.isfile() and m.name.endswith(".json")),
                                 key=lambda m: m.name)
                return [(f"{source}:{m.name}", tar.extractfile(m).read()) for m in members]
        except tarfile.TarError as e:
            raise ValueError(f"{source}: not a folder or a tar archive of one ({e})") from e
    return []


def read_folder(folder: Path) -> tuple[str, dict[str, list[Entry]]]:
    """``(device, {function: entries})`` of a tuned database folder (or a tar archive of it);
    ValueError naming what is wrong with it (and the file, where one is)."""
    files = _files(folder)
    if not files:
        raise ValueError(f"{folder}: no schedule files (*.json) there")
    devices, out, where = set(), {}, {}
    for name, raw in files:
        try:
            data = json.loads(raw.decode())
            if data.get("format") != FORMAT:
                raise ValueError(f"format {data.get('format')!r}, expected {FORMAT}")
            function = data["function"]
            entries = [Entry(**e) for e in data["entries"]]
            devices.add(data["device"])
        except (ValueError, TypeError, KeyError) as e:  # (UnicodeDecodeError is a ValueError)
            raise ValueError(f"{name}: not a schedule database file ({e})") from e
        if function in out:
            raise ValueError(f"{name}: a second file of {function} (the first: {where[function]})")
        out[function], where[function] = entries, name
    if len(devices) != 1:
        raise ValueError(f"{folder}: files of {len(devices)} devices ({', '.join(sorted(devices))}), not one")
    return devices.pop(), out


def ship(folder: Path, into: Path) -> list[str]:
    """Merge ``folder`` into the shipped schedules under ``into``; a line per entry."""
    device, functions = read_folder(folder)
    db = ScheduleDB(device, user_dir=into)  # (store writes the user's folder: here the shipped one)
    lines = []
    for function, entries in sorted(functions.items()):
        for e in entries:
            key = (e.variant, e.bucket, e.source)
            had = any((o.variant, o.bucket, o.source) == key for o in db.entries(function))
            path = db.store(function, e)
            lines.append(f"{'replaced' if had else 'added':8s} {e.variant} {e.bucket} {e.params} -> {path}")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=Path)
    ap.add_argument("--into", type=Path, default=ROOT / "orchestration" / "llama" / "schedules")
    args = ap.parse_args(argv)
    try:
        lines = ship(args.folder, args.into)
    except ValueError as e:
        raise SystemExit(f"ship_schedules: {e}") from None
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
