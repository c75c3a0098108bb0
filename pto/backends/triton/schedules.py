"""Schedules as data (seeds 002 and 003): launch parameters per device, InCore function and shape.

A schedule database holds, for one device (by the name its driver reports), one JSON file per
InCore function (``<function>.json``) with entries keyed by the function's variant, a shape
bucket and the kernel's source hash (one variant name can render to several kernels: the LLaMA
layer's flash attention bakes in the query heads per key/value head, RMSNorm its eps, so LLaMA-2
and LLaMA-3 each keep their own entry). Lookup order: the user's database
(``$PTO_CACHE_DIR/schedules/<device>/``, default ``~/.cache/pto/schedules/<device>/``, what
``pto tune`` writes), then the defaults the program ships beside its code (a program's
``schedules`` folders, e.g. ``orchestration/llama/schedules/<device>/``, :attr:`pto.program.Program.schedules`),
then the defaults shipped for a device of the same architecture that stand in for it where the
device's own have no entry (:data:`KIN`: an H200 runs the H100's, measured faster than the heuristics
there), then the renderer's heuristics. An entry records the
Triton version and the kernel source hash it was measured with; an entry whose version or hash
differs from the running one does not apply (``pto tune --show`` says so).

File format (``format`` 1)::

    {"format": 1, "device": "NVIDIA H100 80GB HBM3", "function": "matmul_tile",
     "entries": [{"variant": "matmul_tile__K4096_N4096_R128", "bucket": "large",
                  "params": {"num_warps": 8, "num_stages": 3, "GROUP": 8},
                  "triton": "3.6.0", "source": "<kernel digest>", "ms": 0.812,
                  "measured": "2026-11-24 pto tune llama7b --seq 16384", "candidates": 24}]}

Shape buckets follow the seed's small / medium / large M: the number of tasks a batch of the
variant runs (for the LLaMA layer, 128-row tiles: up to 2K tokens small, up to 8K medium).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

from pto.cache.cachedir import cache_root
from pto.errors import UsageError

FORMAT = 1
#: devices whose shipped defaults stand in for another's where it ships none of its own, by device
#: key: the same architecture, multiprocessors and shared memory, so the same kernels fit the same
#: way. An H200 is an H100's SM90 die with more and faster HBM: the H100's shipped schedules against
#: the heuristics on an H200 in one call, the 7B layer 15.48 against 17.70 ms at 16,384 tokens, 1.158
#: against 1.220 at 1,537, 3.055 against 3.053 at 4,096; the Llama-3-8B layer at 4,096 2.94 against
#: 2.93 ms in its fastest round (docs/PERF.md, "Schedules on the H200"). The H200 ships its own since
#: (pto tune on an H200); the H100's fill the variants and buckets where tuning found nothing faster
KIN = {"nvidia_h200": ("nvidia_h100_80gb_hbm3",), "nvidia_h200_nvl": ("nvidia_h100_80gb_hbm3",)}
BUCKETS = (("small", 16), ("medium", 64), ("large", None))


def bucket(tasks: int) -> str:
    """The shape bucket of a batch of ``tasks`` tasks."""
    for name, limit in BUCKETS:
        if limit is None or tasks <= limit:
            return name
    return BUCKETS[-1][0]


def device_key(name: str) -> str:
    """The folder of a device's database: its driver name as a file name."""
    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_") or "unknown"


def user_root() -> Path:
    return cache_root() / "schedules"


def triton_version() -> str:
    try:
        from importlib.metadata import version

        return version("triton")
    except Exception:  # triton not installed: nothing can be current
        return ""


@dataclass
class Entry:
    variant: str
    bucket: str
    params: dict
    triton: str
    source: str
    ms: float | None = None
    measured: str = ""
    candidates: int = 0
    extra: dict = field(default_factory=dict)

    def stale_reason(self, source: str, triton: str) -> str | None:
        if self.triton != triton:
            return f"measured with Triton {self.triton}, running {triton or 'none'}"
        if self.source != source:
            return "measured for another kernel source (another configuration of the variant, or older code)"
        return None


class CorruptDatabase(UsageError):
    """A schedule file that is not a well-formed database (reported; the file is set aside)."""


def _read(path: Path) -> list[Entry]:
    """The entries of one function's file ([] if absent). A file that does not parse is moved
    aside to ``<file>.corrupt`` and reported once as a warning; lookups go on without it."""
    if not path.is_file():
        return []
    try:
        data = json.loads(path.read_text())
        if data.get("format") != FORMAT or not isinstance(data.get("entries"), list):
            raise ValueError(f"format {data.get('format')!r}, expected {FORMAT}")
        return [Entry(**e) for e in data["entries"]]
    except (ValueError, TypeError, KeyError) as e:
        import warnings

        bad = path.with_suffix(path.suffix + ".corrupt")
        try:
            path.replace(bad)
            where = f"moved to {bad}"
        except OSError:
            where = "left in place"
        warnings.warn(f"schedule database {path} is corrupt ({e}); ignored and {where}", stacklevel=3)
        return []


def _write(path: Path, device: str, function: str, entries: list[Entry]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {"format": FORMAT, "device": device, "function": function, "entries": [asdict(e) for e in entries]}
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, path)  # readers see the old file or the whole new one


class ScheduleDB:
    """The schedules of one device: the user's database over the shipped defaults (``shipped``:
    folders that hold a ``<device>/`` folder each, a program's first)."""

    def __init__(self, device_name: str, user_dir: Path | None = None, shipped: tuple[Path, ...] = ()):
        self.device = device_name
        key = device_key(device_name)
        self.user_dir = (user_dir or user_root()) / key
        self.shipped_dirs = tuple(Path(d) / key for d in shipped)
        #: the shipped folders of :data:`KIN` devices, used where the device's own has no entry
        self.kin_dirs = tuple(Path(d) / kin for kin in KIN.get(key, ()) for d in shipped)
        self.triton = triton_version()
        #: path -> (the file's stamp when read, its entries): a lookup reads a file again only
        #: when it changed (another process's `pto tune`, or :meth:`store`, replaces it whole)
        self._cache: dict[Path, tuple[tuple | None, list[Entry]]] = {}

    def _sources(self) -> list[tuple[str, Path]]:
        """``(origin, folder)``: the user's database, then each shipped folder, then each shipped
        folder of a kin device (origin ``shipped for <kin>``)."""
        return ([("user", self.user_dir)] + [("shipped", d) for d in self.shipped_dirs]
                + [(f"shipped for {d.name}", d) for d in self.kin_dirs])

    def entries(self, function: str, folder: Path | None = None) -> list[Entry]:
        """The entries of ``function``'s file in ``folder`` (the user's database by default;
        a shipped folder, :attr:`shipped_dirs`)."""
        path = (folder or self.user_dir) / f"{function}.json"
        try:
            st = path.stat()
            stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        except OSError:
            stamp = None
        hit = self._cache.get(path)
        if hit is not None and hit[0] == stamp:
            return hit[1]
        entries = _read(path) if stamp is not None else []
        self._cache[path] = (stamp, entries)
        return entries

    def lookup(self, function: str, variant: str, tasks: int, source: str) -> tuple[dict, str]:
        """``(params, origin)``: the current entry (Triton version and kernel source those running
        now) for the variant and the batch's bucket, from
        the user's database, else the shipped defaults, else a kin device's (``shipped for <kin>``);
        ``({}, "heuristic")`` if none has one."""
        b = bucket(tasks)
        for where, folder in self._sources():
            for e in self.entries(function, folder):
                if e.variant == variant and e.bucket == b and e.stale_reason(source, self.triton) is None:
                    return dict(e.params), where
        return {}, "heuristic"

    def explain(self, function: str, variant: str, tasks: int, source: str) -> list[str]:
        """Why each candidate entry applies or not (for ``pto tune --show``)."""
        b, out = bucket(tasks), []
        for where, folder in self._sources():
            for e in self.entries(function, folder):
                if e.variant != variant or e.bucket != b:
                    continue
                why = e.stale_reason(source, self.triton)
                out.append(f"{where}: {e.params} ({e.measured}{', ' + str(e.ms) + ' ms' if e.ms else ''})"
                           + (f": stale, {why}" if why else ""))
        return out

    def store(self, function: str, entry: Entry) -> Path:
        """Add or replace the user's entry for (variant, bucket, kernel source): one variant name
        can render to several kernels (the LLaMA layer's flash attention bakes in the query heads
        per key/value head, its norms the eps), each with its own entry."""
        path = self.user_dir / f"{function}.json"
        key = (entry.variant, entry.bucket, entry.source)
        entries = [e for e in _read(path) if (e.variant, e.bucket, e.source) != key]
        entries.append(entry)
        entries.sort(key=lambda e: (e.variant, e.bucket, e.source))
        _write(path, self.device, function, entries)
        return path


def for_device(device: str, shipped: tuple[Path, ...] = ()) -> ScheduleDB | None:
    """The database of the device pto runs on (``cpu`` for the interpreter), over the defaults
    in the ``shipped`` folders (the program's, :attr:`pto.program.Program.schedules`). ``PTO_SCHEDULES``
    overrides it: ``none`` for the renderer's heuristics alone (no database), a device name
    (``NVIDIA H100 80GB HBM3``) for that device's databases (another GPU of the same architecture
    runs its schedules: the smoke check runs the H100's on an H200)."""
    chosen = os.environ.get("PTO_SCHEDULES", "").strip()
    if chosen.lower() == "none":
        return None
    if chosen:
        return ScheduleDB(chosen, shipped=shipped)
    if device.startswith("cuda"):
        import torch

        return ScheduleDB(torch.cuda.get_device_name(0), shipped=shipped)
    return ScheduleDB("cpu", shipped=shipped)


__all__ = ["ScheduleDB", "Entry", "KIN", "bucket", "device_key", "for_device", "user_root", "FORMAT", "BUCKETS"]
