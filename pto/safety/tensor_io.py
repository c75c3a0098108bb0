"""User tensors in and out: a program's inputs from a safetensors file (``pto run --inputs``) and
to one (``--save-inputs``), its outputs to one (``--save``), so a run on real weights, or one
that made a NaN, can be reproduced.

Every input of the program (the entry function's ``input`` and ``inout`` tensors) must be in the
file under its name with its shape at the run's scalars; names the program does not have, a
missing input, a wrong shape, a tensor that is not floating point or a file that is not
safetensors are each one error naming the file, the tensor and what was expected, raised before
anything runs. A floating-point tensor of another dtype is converted to the program's. The
header is read first, so a wrong file is refused before any tensor data is loaded. Inputs
(``--save-inputs``: the seeded ones, to edit or to run again with ``--inputs``) and outputs are
written to a temporary file and renamed into place (an interrupted run leaves no partial file),
with the run's settings as the file's metadata: only what the command fixes (program, seq,
config, dtype, options, seed), never a timing, so identical runs write identical bytes.
"""

from __future__ import annotations

import json
import os
import stat
import tempfile
from pathlib import Path

import torch

from pto.buffers import tensor_shapes
from pto.errors import UsageError

_FLOATS = {"F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2"}


def _safetensors(what: str):
    try:
        import safetensors  # noqa: F401
        import safetensors.torch
    except ImportError:
        raise UsageError(f"{what} needs the `safetensors` package (pip install safetensors)") from None
    return safetensors


def program_inputs(module, scalars: dict[str, int]) -> dict[str, tuple[tuple[int, int], torch.dtype]]:
    """Name -> (shape, dtype) of every tensor a run of ``module``'s entry function takes."""
    fn = module.entry_function
    shapes = tensor_shapes(fn, scalars)
    return {t.name: (t.dtype.storage_shape(*shapes[t.name]), t.dtype.torch) for t in fn.tensors
            if t.role in ("input", "inout")}


def load_inputs(path: str, module, scalars: dict[str, int], device, program: str = "the program",
                what: str = "--inputs") -> dict[str, torch.Tensor]:
    """The inputs of ``module`` at ``scalars`` from the safetensors file ``path``, on ``device``
    (see the module docstring for the checks). ``program`` names the run in messages."""
    st = _safetensors(what)
    p = Path(path)
    if not p.is_file():
        raise UsageError(f"{what} {path}: no such file")
    want = program_inputs(module, scalars)
    try:
        f = st.safe_open(str(p), framework="pt", device="cpu")
    except Exception as e:  # the header does not parse: not a safetensors file, or truncated
        raise UsageError(f"{what} {path}: not a readable safetensors file ({_one_line(e)})") from None
    with f:
        have = list(f.keys())
        unknown = [k for k in have if k not in want]
        if unknown:
            raise UsageError(f"{what} {path}: tensor `{unknown[0]}` is not an input of {program} "
                             f"(its inputs: {', '.join(want)})")
        missing = [k for k in want if k not in have]
        if missing:
            raise UsageError(f"{what} {path}: no tensor for the input{'s' if len(missing) > 1 else ''} "
                             f"{', '.join(f'`{k}`' for k in missing)} of {program}")
        for k, (shape, _) in want.items():
            sl = f.get_slice(k)
            got, dt = tuple(sl.get_shape()), sl.get_dtype()
            if got != shape:
                raise UsageError(f"{what} {path}: tensor `{k}` is {_shape(got)} but {program} takes {_shape(shape)}")
            if dt not in _FLOATS:
                raise UsageError(f"{what} {path}: tensor `{k}` is {dt}, not a floating-point type")
        out = {}
        for k, (_, dtype) in want.items():
            try:
                t = f.get_tensor(k)
            except Exception as e:  # a header that promises more data than the file holds
                raise UsageError(f"{what} {path}: cannot read tensor `{k}` ({_one_line(e)})") from None
            out[k] = t.to(device=device, dtype=dtype)
        return out


def save_tensors(path: str, tensors: dict[str, torch.Tensor], metadata: dict | None = None,
                 what: str = "--save") -> None:
    """Write ``tensors`` to the safetensors file ``path``, atomically; ``metadata`` values become
    strings. The same tensors and metadata give the same bytes: safetensors writes its metadata
    in hash order, so the header is written again with the metadata sorted."""
    st = _safetensors(what)
    data = {k: v.detach().contiguous().cpu() for k, v in tensors.items()}
    meta = {str(k): str(v) for k, v in (metadata or {}).items()}
    blob = _sorted_header(st.torch.save(data, metadata=meta))
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".pto-save-", suffix=".safetensors")
    try:
        # mkstemp's file is private (0600): give it the mode open() gives a file it writes, the
        # replaced file's own or the umask's, like the run's other outputs
        os.fchmod(fd, _mode_of_new_file(path))
        with os.fdopen(fd, "wb") as f:
            f.write(blob)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _mode_of_new_file(path: str) -> int:
    """The permissions ``open(path, "w")`` would leave: an existing file's, else 0666 less the umask."""
    try:
        return stat.S_IMODE(os.stat(path).st_mode)
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def save_outputs(path: str, tensors: dict[str, torch.Tensor], metadata: dict | None = None) -> None:
    """The outputs of a run (``--save``); see :func:`save_tensors`."""
    save_tensors(path, tensors, metadata, "--save")


def save_inputs_file(path: str, module, scalars: dict[str, int], tensors: dict[str, torch.Tensor],
                metadata: dict | None = None) -> None:
    """The inputs of a run (``--save-inputs``): every input of ``module`` at ``scalars``, by name,
    as :func:`load_inputs` takes them back."""
    save_tensors(path, {k: tensors[k] for k in program_inputs(module, scalars)}, metadata, "--save-inputs")


def run_metadata(job, shape, seed: int, inputs: str | None) -> dict:
    """The metadata of the files a run of ``job`` (a :class:`pto.engine.Job`) writes: what the
    command fixes, never a timing or anything else that differs between identical runs."""
    where = {"inputs": str(inputs)} if inputs else {"seed": seed}
    return {**job.to_json(), **dict(shape), **where}


def _sorted_header(blob: bytes) -> bytes:
    """A safetensors file's bytes with the header's metadata in sorted order (the tensors' data
    and offsets untouched; the header padded with spaces to 8 bytes, as safetensors does)."""
    n = int.from_bytes(blob[:8], "little")
    header = json.loads(blob[8:8 + n])
    meta = header.pop("__metadata__", None)
    if meta:
        header = {"__metadata__": dict(sorted(meta.items())), **header}
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
    text += b" " * (-len(text) % 8)
    return len(text).to_bytes(8, "little") + text + blob[8 + n:]


def _shape(s) -> str:
    return "x".join(str(int(v)) for v in s) if len(s) else "a scalar"


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__


__all__ = ["load_inputs", "save_tensors", "save_outputs", "save_inputs_file", "run_metadata", "program_inputs"]
