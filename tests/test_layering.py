"""The shape of the house: every module of pto imports only in the allowed directions (the table
below, drawn in docs/ARCHITECTURE.md, "Import directions"), lazy imports inside functions and
modules named by string for ``importlib`` included; no module imports itself back through others
(the import census: no circle); and the IR, builder and text modules stay small.

A module belongs to an area (a folder of pto/, a top-level module, or the programs in incore/
and orchestration/, which install as ``pto.incore`` and ``pto.orchestration``). An area may
import itself and the areas its rule names; an entry with a dot names one module of an area
(``passes.tiling``), not all of it. A new module of pto/ that no area claims fails too, so the
table stays complete. Every folder of pto/ is one area, so no folder spans several rows.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: where each package's sources live in the checkout (pyproject.toml's package-dir)
SOURCES = {"pto": ROOT / "pto", "pto.incore": ROOT / "incore", "pto.orchestration": ROOT / "orchestration"}

#: module prefix (without "pto.") -> area; "" is the package front, pto/__init__.py
AREAS = {
    "": "front",
    "errors": "errors", "version": "version", "layout": "layout", "paths": "paths", "plugins": "plugins",
    "machine": "machine", "cache": "cache",
    "ir": "ir", "passes": "passes", "text": "text", "builder": "builder", "codegen": "codegen",
    "data": "data", "quant": "quant", "evaluator": "evaluator", "backends": "backends", "interp": "interp",
    "runtime": "runtime", "exec": "exec",
    "program": "program", "programs": "program", "generation": "program",
    "safety": "safety", "viz": "viz", "engine": "engine", "cli": "cli",
    "incore": "incore", "orchestration": "orchestration",
    # the generation application: pto generate, above the programs and the engine
    "orchestration.llm": "app",
}

#: area -> what it may import besides itself. Bottom to top: the foundation, the machine and the
#: caches, the compiler (IR, passes, text, builder, codegen), execution (the data of a run,
#: backends, the interpreter, the runtime and its graphs, the executors), the program interface,
#: what reads a run (safety, viz); above them the engine, the command line and the programs.
CORE: dict[str, set[str]] = {
    # the foundation: leaves that anything may import
    "errors": set(),
    "version": set(),
    # whether a path takes a write (the output checks of the command line, the drawings, the cache)
    "paths": set(),
    # how incore/, orchestration/ and runtime_c/ import as pto.* in a checkout
    "layout": set(),
    # the entry points of a group (programs, backends, generators are plugins)
    "plugins": {"errors"},
    # the machine: targets, the device, the ranks of a mesh and their sums
    "machine": {"errors"},
    # where the caches live and the cached cffi compiler
    "cache": {"paths", "errors"},
    # the compiler
    "ir": {"errors"},
    "passes": {"ir", "machine.target", "errors"},
    "text": {"ir", "errors"},
    "builder": {"ir", "text", "passes.tiling", "errors"},
    "front": {"builder", "text", "ir", "errors", "version", "layout"},
    "codegen": {"ir", "passes", "errors", "version"},
    # execution: a run's tensors and batches, quantized weights on torch tensors
    "data": {"ir", "errors"},
    "quant": {"ir", "errors"},
    # the reference tile evaluator (the interpreter's and the torch backend's); its all-reduce
    # over the ranks (machine)
    "evaluator": {"data", "machine", "ir", "quant", "errors"},
    # the backends; the Triton backend owns what launches its kernels: launch settings, the
    # schedule database (in the cache), the megakernel (the device's limits come from the
    # machine), and the cut of a collective task (passes) around its sum over the ranks (machine);
    # the c backend compiles its kernels and whole programs with the runtime's sources (runtime)
    "backends": {"data", "cache", "codegen", "machine", "evaluator", "ir", "passes", "plugins", "quant", "runtime",
                 "errors"},
    "interp": {"evaluator", "data", "ir", "errors"},
    # the runtime binding, its dump, and graphs built by running generated C against it
    "runtime": {"cache", "codegen", "passes", "text", "ir", "machine", "errors"},
    # the executors, their traces and timings
    "exec": {"runtime", "backends", "data", "codegen", "ir", "machine", "errors"},
    # what a runnable program is, the registry of them, what pto generate asks
    "program": {"ir", "plugins", "machine", "errors"},
    # what reads a run: who made the first NaN, the trace against the graph, tensors in and out
    "safety": {"exec", "interp", "backends", "data", "ir", "errors"},
    # drawings of the runtime's dumps and the figures of --plot
    "viz": {"runtime.dump", "ir", "paths", "errors"},
}
RULES: dict[str, set[str]] = dict(CORE)
# the one recipe every command runs by
RULES["engine"] = set(CORE)
# the command line: the parser, the checks, each command's implementation, progress
RULES["cli"] = set(CORE) | {"engine"}
# the programs are plugins (found through entry points, imported by nothing generic): anything
# but what runs them (engine, cli); their InCore functions need no orchestration
RULES["incore"] = set(CORE)
RULES["orchestration"] = set(CORE) | {"incore"}
# the generation application drives the programs' builders through the engine; nothing imports it
# (pto generate finds it through the pto.generators entry points)
RULES["app"] = RULES["orchestration"] | {"orchestration", "engine"}


def _module_files() -> dict[str, Path]:
    """Every module of the package (dotted name -> file), the programs under their installed names."""
    out = {}
    for pkg, folder in SOURCES.items():
        for path in sorted(folder.rglob("*.py")):
            parts = path.relative_to(folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join((pkg, *parts))] = path
    return out


MODULES = _module_files()


def area_of(module: str) -> str | None:
    """The area of a dotted module name of the package (longest matching prefix), or None."""
    parts = module.split(".")[1:]
    for n in range(len(parts), -1, -1):
        area = AREAS.get(".".join(parts[:n]))
        if area is not None and (n > 0 or not parts):
            return area
    return None


def _resolve(module: str, base: str, level: int, name: str | None) -> str:
    """The module an import statement names: ``from P import X`` imports P.X when that is a
    module of the package, else P (a name defined in P)."""
    if level:
        pkg = module.split(".") if MODULES[module].name == "__init__.py" else module.split(".")[:-1]
        base = ".".join(pkg[:len(pkg) - level + 1] + ([base] if base else []))
    if name is not None and f"{base}.{name}" in MODULES:
        return f"{base}.{name}"
    return base


def imports(module: str, source: str | None = None, strings: bool = True) -> list[tuple[int, str]]:
    """(line, module of the package) for every import in ``module``'s source, at any depth: lazy
    imports inside functions count, and so (with ``strings``) does a string constant that is
    exactly the name of a module of the package (the tables that ``importlib.import_module``
    reads)."""
    if source is None:
        source = MODULES[module].read_text()
    out = []
    for node in ast.walk(ast.parse(source, str(MODULES.get(module, module)))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            out += [(node.lineno, _resolve(module, node.module or "", node.level, a.name)) for a in node.names]
        elif strings and isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in MODULES \
                and node.value != "pto":
            out.append((node.lineno, node.value))
    return [(line, m) for line, m in out if m == "pto" or m.startswith("pto.")]


def allowed(area: str, target: str) -> bool:
    """Whether a module of ``area`` may import the package module ``target``."""
    tarea = area_of(target)
    if tarea == area:
        return True
    rel = target[len("pto."):] if target.startswith("pto.") else ""
    for entry in RULES[area]:
        if "." in entry:
            if rel == entry or rel.startswith(entry + "."):
                return True
        elif entry == tarea:
            return True
    return False


def violations(module: str, source: str | None = None) -> list[str]:
    """One line per import of ``module`` that its area's rule does not allow: the file and line,
    what it imports, and the rule."""
    area = area_of(module)
    path = MODULES.get(module)
    where = path.relative_to(ROOT).as_posix() if path else module
    out = []
    for line, target in imports(module, source):
        if not allowed(area, target):
            tarea = area_of(target) or "an unknown area"
            may = ", ".join(sorted(RULES[area])) or "nothing of pto"
            out.append(f"{where}:{line} imports {target} ({tarea}), but {area} may import only {may} "
                       f"(tests/test_layering.py RULES; docs/ARCHITECTURE.md, Import directions)")
    return out


def import_graph() -> dict[str, set[str]]:
    """The import census: module -> the modules of the package it imports, every import at any
    depth (inside functions too) and every module named by string for ``importlib``. A string
    naming the module's own package (an entry-point group named like it: ``"pto.backends"`` in
    pto/backends/base.py) is no import: a package runs before its modules anyway."""
    graph: dict[str, set[str]] = {}
    for module in MODULES:
        found = {m for _, m in imports(module, strings=False)}
        found |= {m for _, m in imports(module) if not module.startswith(m + ".")}
        graph[module] = {m for m in found if m in MODULES and m != module}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles of ``graph``: its strongly connected components of more than one
    module (Tarjan's algorithm), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    component.append(m)
                    if m == node:
                        break
                if len(component) > 1:
                    out.append(sorted(component))
    return out


def test_no_import_circles():
    """No module imports itself back through others, not even from inside a function: a circle
    broken with a lazy import is still a circle (the facts both sides need go in a module both
    import, as pto/ir/facts.py does for the verifiers and the analysis)."""
    found = circles(import_graph())
    assert not found, "import circles: " + "; ".join(" <-> ".join(c) for c in found)


def test_the_census_finds_a_circle_made_by_a_lazy_import():
    graph = import_graph()
    graph["pto.ir.facts"] = graph["pto.ir.facts"] | {"pto.ir.analysis"}  # as a lazy import would add
    assert any({"pto.ir.analysis", "pto.ir.facts", "pto.ir.verify_incore"} <= set(c) for c in circles(graph))
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_every_module_has_an_area():
    homeless = [f"{p.relative_to(ROOT)} ({m})" for m, p in MODULES.items() if area_of(m) is None]
    assert not homeless, ("modules that no area of tests/test_layering.py claims (add them to AREAS and "
                          "docs/ARCHITECTURE.md): " + ", ".join(homeless))


def test_the_rules_point_one_way():
    """The allowed imports form no cycle between areas, so every rule points down."""
    graph = {a: {e.split(".")[0] for e in deps} - {a} for a, deps in RULES.items()}
    state: dict[str, int] = {}

    def visit(a, path):
        if state.get(a) == 1:
            raise AssertionError("the rules allow a cycle: " + " -> ".join((*path, a)))
        if state.get(a) == 2:
            return
        state[a] = 1
        for d in sorted(graph[a]):
            visit(d, (*path, a))
        state[a] = 2

    for a in graph:
        visit(a, ())


@pytest.mark.parametrize("module", sorted(MODULES), ids=lambda m: MODULES[m].relative_to(ROOT).as_posix())
def test_imports_point_down(module):
    bad = violations(module)
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize(("module", "source", "needle"), [
    ("pto.ir.nodes", "def f():\n    from pto.runtime.graph import CompiledProgram\n",
     "pto/ir/nodes.py:2 imports pto.runtime.graph (runtime), but ir may import only errors"),
    ("pto.codegen.c_orch", "from pto import InCore\n",
     "pto/codegen/c_orch.py:1 imports pto (front), but codegen may import only errors, ir, passes, version"),
    ("pto.exec.waves", "import pto.interp.incore\n", "pto/exec/waves.py:1 imports pto.interp.incore (interp)"),
    ("pto.builder.incore", "from pto.passes.expansion import binary_expansion\n",
     "imports pto.passes.expansion.binary_expansion (passes), but builder may import only errors, ir, passes.tiling"),
    ("pto.backends.base", 'EXECUTORS = {"w": ("pto.exec.waves", "Cls")}\n',
     "pto/backends/base.py:1 imports pto.exec.waves (exec)"),
    ("pto.machine.device", "def info():\n    from pto.exec import names\n",
     "pto/machine/device.py:2 imports pto.exec (exec), but machine may import only errors"),
    ("pto.viz.dumpgraph", "from pto.runtime import Runtime\n",
     "pto/viz/dumpgraph.py:1 imports pto.runtime (runtime), but viz may import only errors, ir, paths, runtime.dump"),
    ("pto.orchestration.bgemm", "from pto.engine import run\n",
     "orchestration/bgemm.py:1 imports pto.engine (engine), but orchestration may import only"),
])
def test_an_upward_import_names_the_file_the_line_and_the_rule(module, source, needle):
    bad = violations(module, source)
    assert len(bad) == 1 and needle in bad[0], bad


def test_allowed_imports_pass():
    assert not violations("pto.builder.incore", "from pto.passes.tiling import check_sram\nfrom pto.ir import nodes\n")
    assert not violations("pto.interp.incore", "from pto.evaluator.machine import run_incore_batch\n")
    assert not violations("pto.cli", "import pto\nfrom pto import programs\nfrom pto.viz import draw\n")


@pytest.mark.parametrize("path", sorted(p for d in ("ir", "builder", "text") for p in (ROOT / "pto" / d).glob("*.py")),
                         ids=lambda p: f"{p.parent.name}/{p.name}")
def test_modules_stay_small(path):
    assert len(path.read_text().splitlines()) <= 500, f"{path} has more than 500 lines"


def _documented_rules() -> dict[str, set[str]]:
    """The rows of docs/ARCHITECTURE.md's "Import directions" table for the core areas: area ->
    the areas (and dotted modules) its second column names. Words of the prose are not areas, so
    a name counts when it is an area of RULES or a dotted entry of one."""
    import re

    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    section = text.split("## Import directions", 1)[1]
    table = next(block for block in section.split("\n\n") if block.startswith("| area"))
    names = set(RULES) | {e for deps in RULES.values() for e in deps}
    out: dict[str, set[str]] = {}
    for row in table.splitlines()[2:]:
        cells = [c.strip() for c in row.strip().strip("|").split("|")]
        if len(cells) != 2:
            continue
        first = "front" if "pto/__init__.py" in cells[0] else None
        areas = [first] if first else [a for a in re.findall(r"`([a-z_.]+)`", cells[0]) if a in CORE]
        allowed_part = re.sub(r"never [^)]*", "", cells[1].replace("`", ""))  # "(never interp)" forbids
        said = {w for w in re.findall(r"[a-z_][a-z_.]*[a-z_]", allowed_part) if w in names}
        for a in areas:
            out[a] = said - {"errors"}
    return out


def test_the_documented_table_is_the_rules():
    """docs/ARCHITECTURE.md's table says for every core area exactly what RULES allows (errors
    aside: every area but the leaves may import it)."""
    doc = {a: deps for a, deps in _documented_rules().items() if a != "errors"}
    assert set(doc) == set(CORE) - {"errors"}, sorted(set(CORE) - set(doc) - {"errors"})
    wrong = {a: (sorted(doc[a]), sorted(RULES[a] - {"errors"})) for a in doc if doc[a] != RULES[a] - {"errors"}}
    assert not wrong, f"area: (docs/ARCHITECTURE.md says, tests/test_layering.py RULES allow): {wrong}"


def test_no_generic_module_tells_backends_apart_by_name():
    """Outside the backends (and the command line's text), what a backend can do is asked by
    capability (``pto.backends.capable``), never by comparing its name."""
    from pto.backends import names

    backends = set(names())
    found = []
    for module, path in MODULES.items():
        if area_of(module) in ("backends", "cli"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare):
                consts = [c.value for c in (node.left, *node.comparators) if isinstance(c, ast.Constant)]
                if any(v in backends for v in consts):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not found, "backend names compared (use pto.backends.capable): " + ", ".join(found)


def _tree_entries() -> dict[str, str]:
    """docs/ARCHITECTURE.md's tree (the first code block of "The tree"): each entry's text by its
    path (``pto/`` + an entry indented under it, e.g. ``pto/ir/``, ``pto/engine.py``; a folder at
    the left margin, e.g. ``orchestration/``), its continuation lines included."""
    import re

    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    block = text.split("## The tree", 1)[1].split("```", 2)[1]
    entries: dict[str, str] = {}
    current = None
    for line in block.splitlines():
        m = re.match(r"^( {0,2})([\w.]+/|[\w.]+\.py)(\s|$)", line)
        if m:
            current = ("pto/" if m.group(1) else "") + m.group(2)
            entries[current] = line[m.end(2):]
        elif current is not None:
            entries[current] += " " + line.strip()
    return entries


def test_the_architecture_tree_names_every_module():
    """Every module of pto/, incore/, orchestration/, runtime_c/, tools/ and bench/ is named in
    docs/ARCHITECTURE.md's tree, so the tree cannot drift from the code: a module of a folder of
    pto/ (``pto/passes/fusion/fuse.py``) by its name in that folder's entry (``passes/``), one at the top
    of pto/ by its file name in pto's entries (``engine.py``), the others by their name in their
    top folder's entry (``orchestration/`` names ``textgen``). A new module fails here until the
    tree names it."""
    import re

    entries = _tree_entries()
    top_level = " ".join(f"{k.removeprefix('pto/')} {v}" for k, v in entries.items() if k.startswith("pto/"))
    missing = []
    folders = ("pto", "incore", "orchestration", "runtime_c", "tools", "bench")
    files = [p for d in folders for p in (ROOT / d).rglob("*.py")]
    for path in sorted(files):
        rel = path.relative_to(ROOT)
        if path.stem == "__init__" or "__pycache__" in rel.parts:
            continue
        if rel.parts[0] == "pto" and len(rel.parts) == 2:
            where, text = "pto/", top_level
            named = re.search(rf"(?<![\w/]){re.escape(path.name)}\b", text)
        else:
            where = "/".join(rel.parts[:2]) + "/" if rel.parts[0] == "pto" else rel.parts[0] + "/"
            text = entries.get(where, "")
            named = re.search(rf"(?<![\w.]){re.escape(path.stem)}(?![\w])", text)
        if not named:
            missing.append(f"{rel} (name it in the entry {where!r})")
    assert not missing, "modules docs/ARCHITECTURE.md's tree does not name: " + ", ".join(missing)


def test_the_architecture_tree_names_nothing_that_is_gone():
    """Every entry of docs/ARCHITECTURE.md's tree is a folder or module of the checkout (a moved
    or deleted one fails here until the tree follows), and every folder of pto/ has its entry."""
    entries = _tree_entries()
    gone = [e for e in entries if not (ROOT / e).exists()]
    assert not gone, "docs/ARCHITECTURE.md's tree names what does not exist: " + ", ".join(gone)
    folders = sorted(f"pto/{d.name}/" for d in (ROOT / "pto").iterdir() if (d / "__init__.py").is_file())
    missing = [f for f in folders if f not in entries]
    assert not missing, "folders of pto/ without an entry in docs/ARCHITECTURE.md's tree: " + ", ".join(missing)


def test_every_folder_of_pto_is_one_area():
    """No folder of pto/ spans several rows of the import directions: each is one area (no entry
    of AREAS claims part of a folder for another area), the application's folder aside."""
    split = [k for k in AREAS if "." in k and AREAS[k] != AREAS.get(k.split(".")[0]) and k.split(".")[0] in AREAS
             and k != "orchestration.llm"]
    assert not split, "folders split between areas: " + ", ".join(split)


def test_the_application_sits_above_the_programs_and_nothing_imports_it():
    """The generation application (orchestration/llm) may import what the programs may, the
    programs and the engine; no area may import it (pto generate finds it through its entry
    point); docs/ARCHITECTURE.md's table says so in its row."""
    from pto import plugins
    from pto.generation import GROUP

    assert RULES["app"] == RULES["orchestration"] | {"orchestration", "engine"}
    assert not [a for a, deps in RULES.items() if a != "app" and ("app" in deps or "orchestration.llm" in deps)]
    (ep,) = plugins.group(GROUP).values()
    assert area_of(ep.value.split(":")[0]) == "app"
    section = (ROOT / "docs" / "ARCHITECTURE.md").read_text().split("## Import directions", 1)[1]
    (row,) = [r for r in section.splitlines() if r.startswith("| `app`")]
    assert "`orchestration/llm/`" in row and "`orchestration`" in row and "`engine`" in row, row
