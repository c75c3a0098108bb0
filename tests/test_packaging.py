"""The package list in pyproject.toml covers every subpackage, so a non-editable install has
them all (an editable install or a checkout would hide a missing one)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(sys.version_info < (3, 11), reason="tomllib is Python 3.11+")
def test_every_subpackage_is_installed():
    import tomllib

    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(cfg["packages"])
    found = {"pto"} | {"pto." + ".".join(p.parent.relative_to(ROOT / "pto").parts)
                       for p in (ROOT / "pto").rglob("__init__.py") if p.parent != ROOT / "pto"}
    found |= set(cfg["package-dir"])  # incore/, orchestration/, runtime_c/ mapped into pto
    assert found <= listed, f"missing from pyproject.toml packages: {sorted(found - listed)}"
    for pkg, folder in cfg["package-dir"].items():
        assert (ROOT / folder / "__init__.py").is_file(), (pkg, folder)
    assert cfg["package-data"]["pto.runtime_c"] == ["*.c", "*.h"]


@pytest.mark.skipif(sys.version_info < (3, 11), reason="tomllib is Python 3.11+")
def test_every_shipped_schedule_folder_is_installed():
    """Each device's folder of shipped schedules (``orchestration/llama/schedules/<device>/``, as
    bench/ship_schedules.py makes it) is a package of its own with its JSON files as data: so a
    wheel holds them, and setuptools does not warn of an importable folder left out of
    ``packages`` (a screenful a folder on every install)."""
    import tomllib

    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders = sorted(d.name for d in (ROOT / "orchestration" / "llama" / "schedules").iterdir()
                     if d.is_dir() and any(d.glob("*.json")))
    assert folders, "no shipped schedules found"
    for name in folders:
        pkg = f"pto.orchestration.llama.schedules.{name}"
        assert pkg in cfg["packages"], f"pyproject.toml: {pkg} missing from packages"
        assert cfg["package-data"].get(pkg) == ["*.json"], f"pyproject.toml: {pkg} missing from package-data"


_CHECKOUT = """
import sys
# a plain checkout: no installed pto (the editable install's finder removed), the root on the path
sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in type(f).__module__]
sys.path.insert(0, sys.argv[1])
import pto, pto.incore.matmul, pto.orchestration.llama.program, pto.runtime_c
print(pto.incore.matmul.__file__, pto.orchestration.llama.program.__file__, pto.runtime_c.__file__)
for name in ("pto.tests", "pto.docs"):
    try:
        __import__(name)
    except ModuleNotFoundError:
        continue
    raise SystemExit(f"{name} is importable")
"""


def test_the_checkout_maps_exactly_its_three_folders(tmp_path):
    """incore/, orchestration/ and runtime_c/ import as pto.incore, pto.orchestration and
    pto.runtime_c from a plain checkout (pto/layout.py) and from this environment's install;
    no other folder of the checkout becomes part of pto."""
    import subprocess

    r = subprocess.run([sys.executable, "-c", _CHECKOUT, str(ROOT)], capture_output=True, text=True, cwd=tmp_path,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    files = r.stdout.split()
    assert files == [str(ROOT / "incore" / "matmul.py"), str(ROOT / "orchestration" / "llama" / "program.py"),
                     str(ROOT / "runtime_c" / "__init__.py")]
    for name in ("pto.tests", "pto.docs"):
        with pytest.raises(ModuleNotFoundError):
            __import__(name)
