"""A program from outside the package: tests/plugins/pto_example is a distribution of its own
whose pyproject.toml declares ``example`` in the ``pto.programs`` entry-point group. Installed
for real (pip, into a temporary folder put on PYTHONPATH), it runs against its torch reference,
generates C that builds, and is estimated through the ordinary command line, with its own
``--scale`` option; nothing in pto names it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

PLUGIN = Path(__file__).resolve().parent / "pto_example"


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    pytest.importorskip("setuptools", reason="building the plugin without build isolation needs setuptools")
    tmp = tmp_path_factory.mktemp("plugin")
    # a copy: building in place would leave build/ and *.egg-info in the checkout
    src = shutil.copytree(PLUGIN, tmp / "src", ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                        "--no-index", "--disable-pip-version-check", "--target", str(tmp / "site"), str(src)],
                       capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    return tmp / "site"


def pto(*args, site: Path | None = None) -> subprocess.CompletedProcess:
    paths = [str(site)] if site else []
    paths += [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    return subprocess.run([sys.executable, "-m", "pto.cli", *args], capture_output=True, text=True, env=env,
                          timeout=300)


@pytest.mark.slow
def test_installed_with_its_entry_point(site):
    (info,) = site.glob("pto_example-*.dist-info")
    assert "example = pto_example:PROGRAM" in (info / "entry_points.txt").read_text()
    r = pto("run", "example")  # not installed: not a program
    assert r.returncode != 0 and "unknown program 'example'" in r.stderr


def test_run_checks_against_the_reference_with_its_option(site):
    r = pto("run", "example", "--rows", "100", "--scale", "2", "--check", "--json", site=site)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert (out["program"], out["config"], out["scale"], out["rows"]) == ("example", "tiny", 2.0, 100)
    assert (out["tasks"], out["edges"]) == (8, 4)  # 4 row tiles (the last of 4 rows), 2 stages each
    assert out["rel_err"] <= 1e-5


def test_codegen_writes_c_that_builds_and_counts_the_tasks(site, tmp_path):
    out = tmp_path / "gen"
    r = pto("codegen", "example", "--out", str(out), "--scale", "2", site=site)
    assert r.returncode == 0, r.stderr
    for name in ("example.c", "main.c", "example.pto", "kernels/scale_tile.py", "kernels/gate_tile.py"):
        assert (out / name).is_file(), name
    assert "muls %t, %t, 2.0" in (out / "example.pto").read_text()  # the option reached the program
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler to build the generated C")
    exe = tmp_path / "graph"
    build = subprocess.run([cc, "-O2", "-Wall", "-Wextra", "-Werror", *map(str, sorted(out.glob("*.c"))),
                            "-o", str(exe)], capture_output=True, text=True, timeout=120)
    assert build.returncode == 0 and not build.stderr, build.stderr
    ran = subprocess.run([str(exe), "77"], capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.split()[:4] == ["tasks", "6", "edges", "3"]


def test_estimate_uses_its_closed_form(site):
    r = pto("estimate", "example", "--rows", "100,1000", "--json", site=site)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert (out["program"], out["scale"], out["closed_form"]) == ("example", 0.5, True)
    rows = out["rows"]
    assert [x["rows"] for x in rows] == [100, 1000]
    assert [(x["tasks"], x["edges"]) for x in rows] == [(8, 4), (64, 32)]
    assert all(x["measured"] and x["runtime_bytes"] > 0 for x in rows)
