"""Where pto's parts live in a source checkout, and how they are imported.

The repository's top level is the user's: ``incore/`` (the InCore function library),
``orchestration/`` (the programs) and ``runtime_c/`` (the C runtime) sit beside ``pto/`` and are
imported as ``pto.incore``, ``pto.orchestration`` and ``pto.runtime_c``. One mechanism, three
ways of running:

- installed (a wheel): pyproject.toml's ``package-dir`` copies them into the ``pto`` package;
- installed editable (``pip install -e .``): setuptools' finder maps the same names to the
  folders;
- a plain checkout (``PYTHONPATH=.``, as on the GPU machine): :func:`install` puts a finder on
  ``sys.meta_path`` that maps exactly these three names (:data:`SUBPACKAGES`) to the folders.

Nothing else of the checkout becomes part of ``pto``: ``pto.tests`` or ``pto.bench`` do not
exist under any of the three.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from pathlib import Path

#: import name -> the checkout folder it lives in (pyproject.toml's package-dir says the same)
SUBPACKAGES = {f"pto.{folder}": folder for folder in ("incore", "orchestration", "runtime_c")}


class CheckoutFinder(importlib.abc.MetaPathFinder):
    """Finds :data:`SUBPACKAGES` in a checkout rooted at ``root``; their modules are then found
    through the packages' own ``__path__``."""

    def __init__(self, root: Path):
        self.root = root

    def find_spec(self, name, path=None, target=None):
        folder = SUBPACKAGES.get(name)
        if folder is None:
            return None
        init = self.root / folder / "__init__.py"
        if not init.is_file():
            return None
        return importlib.util.spec_from_file_location(name, init, submodule_search_locations=[str(init.parent)])


def install(package_dir: Path) -> None:
    """In a checkout (the three folders beside ``package_dir``, none inside it), put a
    :class:`CheckoutFinder` first on ``sys.meta_path``; an installed pto needs none."""
    root = package_dir.parent
    installed = (package_dir / "incore").is_dir()
    if installed or not (root / "incore" / "__init__.py").is_file():
        return
    if not any(isinstance(f, CheckoutFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, CheckoutFinder(root))


__all__ = ["SUBPACKAGES", "CheckoutFinder", "install"]
