"""The package dependency order of docs/architecture.md, read from every import in the source (module
level and inside functions): each package imports only packages below it, siblings never import each
other, and no two modules import each other, directly or through others."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "dsv32"

# Each package with the packages it may import (transitively downward). The leaf modules
# `errors`, `jsonl`, `paths`, `recipe`, `runlog`, `trackers` and `training_guard` may be imported by
# anything.
LAYERS = {
    "cli": {
        "view",
        "posttrain",
        "interop",
        "train",
        "rl",
        "synth",
        "serve",
        "eval",
        "agent",
        "engine",
        "envs",
        "model",
        "dsa",
        "chat",
        "distributed",
    },
    "posttrain": {
        "train",
        "rl",
        "synth",
        "eval",
        "agent",
        "engine",
        "envs",
        "model",
        "dsa",
        "chat",
        "distributed",
    },
    "train": {"agent", "engine", "envs", "model", "dsa", "chat", "distributed"},
    "rl": {"agent", "engine", "envs", "model", "dsa", "chat", "distributed"},
    "synth": {"agent", "engine", "envs", "model", "dsa", "chat"},
    "serve": {"agent", "engine", "envs", "model", "dsa", "chat"},
    "eval": {"agent", "engine", "envs", "model", "dsa", "chat"},
    "interop": {"agent", "engine", "envs", "model", "dsa", "chat"},
    "agent": {"engine", "envs", "model", "dsa", "chat"},
    "engine": {"model", "dsa", "chat"},
    "envs": {"model", "dsa", "chat"},
    "model": {"dsa"},
    "dsa": set(),
    "chat": set(),
    "distributed": set(),
    "view": set(),
}
LEAVES = {"errors", "jsonl", "paths", "recipe", "runlog", "trackers", "training_guard"}


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """Every ``dsv32...`` module imported anywhere in ``path`` (relative imports resolved)."""
    tree = ast.parse(path.read_text(), str(path))
    package = _module_name(path) if path.name == "__init__.py" else _module_name(path).rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "dsv32"}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base]) if base else ".".join(anchor)
            if base.split(".")[0] != "dsv32":
                continue
            found.add(base)
            for alias in node.names:  # `from dsv32.x import y` may import the module dsv32.x.y
                if (SRC.parent / Path(*f"{base}.{alias.name}".split("."))).with_suffix(".py").exists():
                    found.add(f"{base}.{alias.name}")
    return found


def _graph() -> dict[str, set[str]]:
    return {_module_name(p): _imports(p) for p in SRC.rglob("*.py")}


def _top(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_every_package_has_a_layer():
    packages = {p.name for p in SRC.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    modules = {p.stem for p in SRC.glob("*.py") if p.stem != "__init__"}
    assert packages <= set(LAYERS), f"add {packages - set(LAYERS)} to LAYERS and docs/architecture.md"
    assert modules <= LEAVES | {"cli"}, f"top-level modules must be leaves: {modules - LEAVES}"


def test_packages_import_only_downward():
    bad = []
    for module, imported in sorted(_graph().items()):
        src = _top(module)
        for target in sorted(imported):
            dst = _top(target)
            if dst in ("", src) or dst in LEAVES:
                continue
            if src in LEAVES:
                bad.append(f"{module} -> {target} (leaf modules import no package)")
            elif dst not in LAYERS.get(src, set()):
                bad.append(f"{module} -> {target}")
    assert not bad, "imports against the dependency order:\n" + "\n".join(bad)


def test_leaf_modules_import_only_leaves():
    for module, imported in _graph().items():
        if _top(module) in LEAVES:
            assert {_top(t) for t in imported} <= LEAVES, module


def test_no_import_cycles():
    graph = {m: {t for t in ts if t in _graph_keys()} for m, ts in _graph().items()}
    # a package's __init__ re-exporting its own modules is not a cycle between modules
    edges = {
        m: {t for t in ts if not (t != m and m.startswith(t + ".") and _is_package(t))}
        for m, ts in graph.items()
    }
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
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
                cycles.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    assert not cycles, f"import cycles: {cycles}"


def _graph_keys() -> set[str]:
    return {_module_name(p) for p in SRC.rglob("*.py")}


def _is_package(module: str) -> bool:
    return (SRC.parent / Path(*module.split(".")) / "__init__.py").exists()
