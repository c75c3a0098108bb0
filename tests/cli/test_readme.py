"""The README's Python examples run as written (the "Writing a program" section builds a module,
prints its text form and executes it)."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_python_blocks_run_in_order(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the examples write files (x.safetensors) where they run
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    assert len(blocks) >= 2, "the README lost its examples"
    scope: dict = {}
    for block in blocks:  # later blocks use what earlier ones defined (module, x)
        exec(compile(block, str(README), "exec"), scope)
    assert "orchestration @softmax" in capsys.readouterr().out
    assert scope["out"]["y"].shape == (1000, 256)
    assert (tmp_path / "x.safetensors").is_file()
