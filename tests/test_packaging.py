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
