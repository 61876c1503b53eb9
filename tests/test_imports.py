"""The architecture, checked: no import cycles in ``lopd/``, every import points down the layers, and
no module outside ``lopd/envs/`` imports a concrete environment (``env.name`` picks one through the registry).

Every ``import`` statement (module level or inside a function) is an edge. The layers, bottom to
top, are :data:`LAYERS` (docs/architecture.md explains them); a module may import its own layer
and any layer below it. ``memory`` and ``latent`` are peers: neither imports the other.

Run alone: ``.venv/bin/pytest tests/test_imports.py -q`` (it reads the sources as AST and imports
nothing); ``.venv/bin/python -m tests.test_imports`` prints the layer-to-layer edge counts.
"""

import ast
from collections import Counter
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "lopd"

# Bottom to top: layer -> rank. Equal ranks are peers and may not import each other.
LAYERS = {"envs": 0, "core": 1, "ops": 2, "policy": 3, "memory": 4, "latent": 4, "train": 5, "stages": 6, "experiments": 7, "cli": 8}
CORE = {"lopd", "lopd.config", "lopd.io", "lopd.layout"}  # the package itself, params, atomic writes, paths


def modules() -> dict[str, Path]:
    out = {}
    for path in PKG.rglob("*.py"):
        parts = path.relative_to(PKG.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def import_graph() -> dict[str, set[str]]:
    """``{module: {lopd modules it imports}}``; ``from lopd.memory import index`` names the module ``lopd.memory.index``."""
    mods = modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in mods else node.module for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level > 0:  # relative: resolve against the package
                base = mod.split(".")[: -node.level + (1 if path.name == "__init__.py" else 0) or None]
                stem = ".".join(base + ([node.module] if node.module else []))
                targets = [f"{stem}.{a.name}" if f"{stem}.{a.name}" in mods else stem for a in node.names]
            for t in targets:
                if t in mods and t != mod and t != "lopd":
                    graph[mod].add(t)
    return graph


def layer_of(module: str) -> str:
    """``lopd.memory.bank`` -> ``memory``; ``lopd.config`` -> ``core``; ``lopd.cli`` -> ``cli``."""
    if module in CORE:
        return "core"
    top = module.split(".")[1]
    return top if top in LAYERS else f"<undeclared: lopd.{top}>"


def upward_edges(graph: dict[str, set[str]]) -> list[str]:
    """Every edge that does not point down (or within one layer), as ``a (layer) -> b (layer)``."""
    bad = []
    for src, targets in graph.items():
        for dst in targets:
            a, b = layer_of(src), layer_of(dst)
            if a == b:
                continue
            if a not in LAYERS or b not in LAYERS or LAYERS[b] >= LAYERS[a]:
                bad.append(f"{src} ({a}) -> {dst} ({b})")
    return sorted(bad)


def test_the_graph_sees_module_and_function_level_imports():
    g = import_graph()
    assert "lopd.config" in g["lopd.experiments.sweep"]  # module level
    assert "lopd.layout" in g["lopd.experiments.sweep"]  # `from lopd import layout`
    assert "lopd.policy.kv_backend" in g["lopd.policy.backends"]  # inside make_backend
    assert "lopd.memory.index" in g["lopd.memory.retrieval"]  # `from lopd.memory import index as faiss_index`
    assert "lopd.envs.protocol" in g["lopd.envs.toolworld.families.base"]  # `from ...protocol import ...`


def test_no_import_cycles_in_lopd():
    try:
        list(TopologicalSorter(import_graph()).static_order())
    except CycleError as e:
        raise AssertionError(f"import cycle: {' -> '.join(e.args[1])}") from None


def test_every_module_belongs_to_a_declared_layer():
    undeclared = sorted(m for m in modules() if layer_of(m) not in LAYERS)
    assert not undeclared, f"modules outside the layers of docs/architecture.md: {undeclared} (add the folder to LAYERS)"


def test_every_import_points_down_the_layers():
    bad = upward_edges(import_graph())
    assert not bad, "imports that climb a layer (or cross memory <-> latent):\n" + "\n".join(bad)


def test_the_layer_check_catches_an_upward_and_a_peer_import():
    g = {"lopd.policy.rollout": {"lopd.train.losses"}, "lopd.memory.bank": {"lopd.latent.teacher"},
         "lopd.train.grpo": {"lopd.policy.scoring", "lopd.train.losses"}}
    assert upward_edges(g) == ["lopd.memory.bank (memory) -> lopd.latent.teacher (latent)",
                               "lopd.policy.rollout (policy) -> lopd.train.losses (train)"]


# The environments every stage reaches only through lopd.envs.registry (env.name), never by import.
CONCRETE_ENVS = ("lopd.envs.toolworld", "lopd.envs.bfcl", "lopd.envs.code")


def concrete_env_imports(graph: dict[str, set[str]]) -> list[str]:
    """Every import of a concrete environment from outside ``lopd/envs/``, as ``a -> b``."""
    return sorted(f"{src} -> {dst}" for src, targets in graph.items() if not src.startswith("lopd.envs.")
                  for dst in targets if any(dst == c or dst.startswith(c + ".") for c in CONCRETE_ENVS))


def test_no_module_outside_envs_imports_a_concrete_environment():
    bad = concrete_env_imports(import_graph())
    assert not bad, ("modules that import a concrete environment instead of asking lopd.envs.registry "
                     "(get_environment / env.name):\n" + "\n".join(bad))


def test_the_environment_check_catches_a_direct_import():
    g = {"lopd.stages.collect": {"lopd.envs.toolworld.env", "lopd.envs.registry"}, "lopd.envs.bfcl.env": {"lopd.envs.toolworld.lite"}}
    assert concrete_env_imports(g) == ["lopd.stages.collect -> lopd.envs.toolworld.env"]


def layer_matrix(graph: dict[str, set[str]]) -> Counter:
    return Counter((layer_of(a), layer_of(b)) for a, ts in graph.items() for b in ts if layer_of(a) != layer_of(b))


if __name__ == "__main__":
    g = import_graph()
    order = sorted(LAYERS, key=LAYERS.get)
    m = layer_matrix(g)
    print("imports from (row) into (column); the upper right must be empty\n")
    print(f"{'':>12}" + "".join(f"{c:>12}" for c in order))
    for r in order:
        print(f"{r:>12}" + "".join(f"{m.get((r, c), 0) or '.':>12}" for c in order))
    print(f"\n{len(g)} modules, {sum(len(t) for t in g.values())} import edges, {len(upward_edges(g))} pointing up")
