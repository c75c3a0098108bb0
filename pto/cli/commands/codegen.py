"""``pto codegen``: the self-contained folder it writes (:func:`codegen`), pto's own output,
replaced whole, never mixed with an earlier one and never written over the user's files.

Every output holds a manifest, :data:`MANIFEST`, listing each file pto wrote with its SHA-256.
A folder is pto's own when every file in it is listed there with the content pto wrote, or is
one of :data:`BUILT`: ``graph``, the binary that README's ``cc -O2 ... DIR/*.c -o DIR/graph``
builds from the sources, which is pto's output too (it is removed with the sources it was built
from, so no stale binary survives a new codegen). Writing into a folder:

- new, empty, or pto's own: the new output replaces the old one whole (no stale kernel of
  another configuration, no stale ``graph``);
- anything else (no manifest, a file the manifest does not list, a listed file changed since):
  refused, naming the folder and the first such files, unless ``force``: then pto's files of the
  old manifest and the files of the new output are replaced, and every other file is kept.

The new output is written to a temporary sibling folder first, then renamed into place (a new
folder) or moved in file by file with the manifest last (an existing one), so a codegen that
fails leaves the folder as it was.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

from pto.cli.progress import iterate
from pto.codegen.c_incore import render_incore
from pto.codegen.c_main import generate_main
from pto.codegen.c_orch import generate_c
from pto.codegen.triton import render
from pto.engine import Job
from pto.errors import UsageError
from pto.ir.analysis import has_collective
from pto.passes.expansion.binary_expansion import expand_binary, strip_adaptive
from pto.runtime import runtime_native_files, runtime_portable_files
from pto.text import format_module

MANIFEST = "pto-manifest.json"
#: files built from pto's output by the commands README shows: pto's own, replaced with it
BUILT = ("graph",)


def codegen(job: Job, out_dir: str, shape: dict[str, int] | None = None, adaptive: bool = True,
            progress: bool = False, force: bool = False) -> list[str]:
    """Write a self-contained directory: the orchestration .c, the InCore functions as C
    (``NAME_incore.c``), the runtime sources and headers, a main.c (``cc -O2 -Wall -Wextra -Werror
    DIR/*.c -o DIR/graph -lm -pthread`` builds a program that builds the graph for the shape on
    its command line, ``graph SEQ``, and runs it on data from a file, ``graph SEQ --run
    IN.safetensors --out OUT.safetensors``; the values of ``shape`` given here become its
    defaults), the module's text form, the Triton kernel sources of every InCore variant the
    program calls, and the manifest of what pto wrote. Everything is generated before the folder
    is touched; an earlier output of pto is replaced whole, a folder holding other files is
    refused unless ``force`` (the module docstring)."""
    check(out_dir, force)
    prog, s = job.program, job.settings
    module = prog.build(s, prog.shape(shape))
    lowered = expand_binary(module) if adaptive else strip_adaptive(module)
    corch = generate_c(lowered)
    # the InCore functions as C, unless one is a collective (no C kernel communicates) or a
    # tensor is quantized (the standalone program reads f32, f16 and bf16 tensors only)
    native = not (any(has_collective(v.func) for v in corch.variants)
                  or any(t.dtype.is_quantized for t in lowered.entry_function.tensors))
    files = {corch.filename: corch.source.encode(),
             "main.c": generate_main(corch, prog.scalar_exprs(s), prog.name,
                                     [(p.name, (shape or {}).get(p.name)) for p in prog.shape_params],
                                     lowered.entry_function.tensors if native else None).encode()}
    files.update({src.name: src.read_bytes() for src in runtime_portable_files()})
    if native:
        incore = render_incore([v.func for v in corch.variants], corch.name)
        files[incore.filename] = incore.source.encode()
        files.update({src.name: src.read_bytes() for src in runtime_native_files()})
    files[f"{corch.name}.pto"] = format_module(module).encode()
    for v in iterate(corch.variants, "rendering kernels", progress, unit="kernel"):
        if has_collective(v.func):  # runs through the torch evaluator: no kernel
            continue
        k = render(v.func)
        files[f"kernels/{k.filename}"] = k.source.encode()
    about = {"program": prog.name, **s.to_json(), "shape": dict(shape or {}), "adaptive": adaptive}
    return write(out_dir, files, about, force)


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _files(folder: Path) -> list[str]:
    """Every entry of ``folder`` that is not a directory (files, links, ...), as relative paths."""
    out = []
    for root, dirs, names in os.walk(folder):
        out += [os.path.relpath(os.path.join(root, n), folder) for n in names]
        out += [os.path.relpath(os.path.join(root, d), folder) for d in dirs if os.path.islink(os.path.join(root, d))]
    return sorted(out)


def _manifest(folder: Path) -> dict[str, str] | None:
    """The files the folder's manifest lists (relative path -> SHA-256), None without a valid one."""
    try:
        data = json.loads((folder / MANIFEST).read_text())
        files = data["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    ok = isinstance(files, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in files.items())
    return files if ok else None


def check(path: str, force: bool = False, what: str = "--out") -> None:
    """Refuse, before any work, a folder that is not pto's own (see the module docstring)."""
    folder = Path(path)
    if not folder.is_dir():
        return
    parent = folder.resolve().parent
    if not os.access(parent, os.W_OK):
        raise UsageError(f"{what} {path}: cannot write its parent folder {parent} (pto writes the new output "
                         "beside the folder, then moves it in)")
    if force:
        return
    files = _files(folder)
    if not files:
        return
    listed = _manifest(folder)
    theirs = [f for f in files if f != MANIFEST and f not in BUILT and (listed is None or f not in listed)]
    changed = [f for f in files if listed is not None and f in listed
               and not os.path.islink(folder / f) and _sha((folder / f).read_bytes()) != listed[f]]
    if listed is None or theirs or changed:
        bad = theirs or changed or files
        names = ", ".join(bad[:3]) + (", ..." if len(bad) > 3 else "")
        why = "files pto did not write" if listed is None or theirs else "files changed since pto wrote them"
        raise UsageError(f"{what} {path}: holds {why} ({names}); give a new or empty folder, or --force "
                         "to write pto's files over it (the other files are kept)")


def write(path: str, files: dict[str, bytes], about: dict | None = None, force: bool = False,
          what: str = "--out") -> list[str]:
    """Write ``files`` (relative path -> content) and the manifest into the folder ``path`` (see
    the module docstring); returns the paths written, the manifest last."""
    check(path, force, what)
    folder = Path(path)
    manifest = {"written_by": "pto codegen", **(about or {}), "files": {k: _sha(v) for k, v in files.items()}}
    payload = {**files, MANIFEST: (json.dumps(manifest, indent=1) + "\n").encode()}
    parent = folder.resolve().parent if folder.is_dir() else Path(os.path.abspath(path)).parent
    tmp = Path(tempfile.mkdtemp(dir=parent, prefix=f".{folder.resolve().name}.pto-"))
    try:
        for rel, data in payload.items():
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            (tmp / rel).write_bytes(data)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o777 & ~umask)  # mkdtemp's folder is private; the output is an ordinary folder
        if not folder.exists():
            os.rename(tmp, folder)
        else:
            _install(tmp, folder, list(payload))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return [str(folder / rel) for rel in payload]


def _install(tmp: Path, folder: Path, new: list[str]) -> None:
    """Move the new output into an existing folder: pto's old files out (the old manifest first,
    so an interrupted install is never taken for a whole output), the new ones in, the manifest
    last; folders that pto's old files leave empty are removed."""
    old = [*(_manifest(folder) or {}), *BUILT]
    (folder / MANIFEST).unlink(missing_ok=True)
    for rel in old:
        p = folder / rel
        if p.is_file() or p.is_symlink():
            p.unlink()
    for rel in [r for r in new if r != MANIFEST] + [MANIFEST]:
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        os.replace(tmp / rel, folder / rel)
    for d in sorted({Path(rel).parent for rel in old if Path(rel).parent != Path(".")}, key=lambda p: -len(p.parts)):
        if (folder / d).is_dir() and not any((folder / d).iterdir()):
            (folder / d).rmdir()


__all__ = ["MANIFEST", "BUILT", "codegen", "check", "write"]
