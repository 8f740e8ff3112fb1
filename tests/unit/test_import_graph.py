"""The project's import graph, counted as Python would run it: imports at the top of a module,
inside functions and through importlib (the experiment registry's module names) alike. No
cycle anywhere, and an import inside a function only where it defers a heavy optional module
on purpose (the allowlist below, each with its reason). The layers themselves are
import-linter's contracts (test_layers.py)."""
from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# Folder -> the import name it is installed under (setup.py's package_dir).
PACKAGES = {"testbed": "testbed", "controllers": "testbed.controllers",
            "traffic": "testbed.traffic"}
# (importing module, imported module) -> why the import waits inside a function.
DEFERRED = {
    ("testbed.measure.roce", "testbed.traffic.roce.wire"):
        "wire imports scapy (about 0.7 s); only decoding a packet capture needs it",
    ("testbed.traffic.collectives.program", "testbed.traffic.collectives.roce_transport"):
        "every rank program starts in a host; only a RoCE rank pays for the engine and scapy",
}


def modules() -> dict[str, Path]:
    found = {}
    for folder, name in PACKAGES.items():
        for path in (REPO / folder).rglob("*.py"):
            parts = list(path.relative_to(REPO / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join([name, *parts])] = path
    return found


def owner(name: str, known: dict) -> str | None:
    """The project module ``name`` is, or is inside (a class or function of it)."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def imports(known: dict[str, Path]) -> list[tuple[str, str, bool]]:
    """(importing module, imported module, inside a function) for every project import; a
    module that calls importlib.import_module imports every project module it names in a
    string."""
    edges = set()
    for module, path in known.items():
        text = path.read_text()
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        by_name = "import_module" in text

        def visit(node, in_function: bool) -> None:
            for child in ast.iter_child_nodes(node):
                inside = in_function or isinstance(child, (ast.FunctionDef,
                                                           ast.AsyncFunctionDef, ast.Lambda))
                targets = []
                if isinstance(child, ast.Import):
                    targets = [alias.name for alias in child.names]
                elif isinstance(child, ast.ImportFrom):
                    base = child.module or ""
                    if child.level:
                        up = package.split(".")[:len(package.split(".")) - child.level + 1]
                        base = ".".join(up + ([base] if base else []))
                    targets = [f"{base}.{alias.name}" for alias in child.names]
                elif by_name and isinstance(child, ast.Constant) and isinstance(child.value, str):
                    targets = [child.value.partition(":")[0]] if child.value.partition(
                        ":")[0] in known else []
                for target in targets:
                    found = owner(target, known)
                    if found and found != module:
                        edges.add((module, found, inside))
                visit(child, inside)

        visit(ast.parse(text, str(path)), False)
    return sorted(edges)


def cycles(edges) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    graph = defaultdict(set)
    for src, dst, _ in edges:
        graph[src].add(dst)
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return found


def test_the_graph_sees_every_kind_of_import():
    known = modules()
    edges = imports(known)
    assert ("testbed.experiments.registry", "testbed.experiments.dctcp.experiment", False) \
        in edges  # through importlib, by name
    assert ("testbed.measure.roce", "testbed.traffic.roce.wire", True) in edges
    assert cycles([("a", "b", False), ("b", "c", True), ("c", "a", False), ("c", "d", False)]) \
        == [["a", "b", "c"]]


def test_no_import_cycles():
    assert cycles(imports(modules())) == []


def test_imports_inside_functions_only_defer_heavy_modules():
    local = {(src, dst) for src, dst, inside in imports(modules()) if inside}
    assert local <= set(DEFERRED), f"imports to move to the top: {sorted(local - set(DEFERRED))}"
    assert set(DEFERRED) <= local, f"allowed but gone: {sorted(set(DEFERRED) - local)}"
