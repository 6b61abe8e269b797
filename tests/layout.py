"""The package's import graph, read from its source (every import, inside functions too)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "pyllm_a100"


def module_name(path: Path) -> str:
    """``serve/server.py`` -> ``serve.server``; a package's ``__init__.py`` -> the package (``""`` for the root)."""
    parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def import_graph() -> dict[str, set[str]]:
    """module -> the pyllm_a100 modules it imports (names relative to pyllm_a100; packages resolve to their __init__)."""
    names = {module_name(p) for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        me = module_name(path)
        package = me if path.name == "__init__.py" else me.rpartition(".")[0]
        deps = graph.setdefault(me, set())
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".") if package else []
                    base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
                    prefix = ".".join(base + ([node.module] if node.module else []))
                elif node.module and node.module.startswith("pyllm_a100"):
                    prefix = node.module.removeprefix("pyllm_a100").lstrip(".")
                else:
                    continue
                for alias in node.names:
                    full = f"{prefix}.{alias.name}" if prefix else alias.name
                    deps.add(full if full in names else prefix)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith("pyllm_a100."):
                        deps.add(alias.name.removeprefix("pyllm_a100."))
        deps.discard(me)
    return graph
