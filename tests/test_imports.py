"""No import cycles in ``lopd/``: every ``import`` statement (module level or inside a function) is an edge.

Run alone: ``.venv/bin/pytest tests/test_imports.py -q``; it reads the sources (AST), imports nothing.
"""

import ast
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "lopd"


def modules() -> dict[str, Path]:
    out = {}
    for path in PKG.rglob("*.py"):
        parts = path.relative_to(PKG.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def import_graph() -> dict[str, set[str]]:
    """``{module: {lopd modules it imports}}``; ``from lopd import layout`` names the module ``lopd.layout``."""
    mods = modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in mods else node.module for a in node.names]
            for t in targets:
                if t in mods and t != mod and t != "lopd":
                    graph[mod].add(t)
    return graph


def test_the_graph_sees_module_and_function_level_imports():
    g = import_graph()
    assert "lopd.config" in g["lopd.experiments.sweep"]  # module level
    assert "lopd.layout" in g["lopd.experiments.sweep"]  # `from lopd import layout`
    assert "lopd.policy.kv_backend" in g["lopd.policy.backends"]  # inside make_backend


def test_no_import_cycles_in_lopd():
    try:
        list(TopologicalSorter(import_graph()).static_order())
    except CycleError as e:
        raise AssertionError(f"import cycle: {' -> '.join(e.args[1])}") from None
