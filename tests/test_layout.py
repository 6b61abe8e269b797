"""The tree reads like the architecture (docs/architecture.md): layers that import one way, small modules."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from layout import PACKAGE, import_graph

REPO = PACKAGE.parent


def test_the_layering_contract_holds() -> None:
    """import-linter's contract in pyproject.toml: cli on top, then tasks, bench, serve/embedded, models, synth, build."""
    lint = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or shutil.which("lint-imports")
    assert lint, "lint-imports is not installed: pip install '.[test]' (it brings import-linter)"
    result = subprocess.run([lint, "--no-cache"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and "0 broken" in result.stdout, result.stdout[-3000:] + result.stderr[-2000:]


def test_no_module_imports_itself_back() -> None:
    """No import circle anywhere in the package, at module level or inside functions (the root __init__ aside)."""
    graph = import_graph()
    graph.pop("", None)
    for deps in graph.values():
        deps.discard("")
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == 1:
                return path[path.index(dep):] + [dep] if dep in path else path + [dep]
            if dep not in state:
                found = visit(dep, path + [dep])
                if found:
                    return found
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state:
            cycle = visit(start, [start])
            assert cycle is None, " -> ".join(cycle)


def test_few_top_level_modules_and_none_too_long() -> None:
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= 12, top
    long_modules = [f"{p.relative_to(REPO)} ({n})" for p in PACKAGE.rglob("*.py") if (n := len(p.read_text().splitlines())) > 700]
    assert not long_modules, long_modules
    # the lab (outside the wheel) has the same cap for its modules and scripts, so nothing moves into the package to fit
    lab = [*(REPO / "lab").rglob("*.py"), *(p for p in (REPO / "lab" / "scripts").iterdir() if p.suffix == "")]
    long_lab = [f"{p.relative_to(REPO)} ({n})" for p in lab if (n := len(p.read_text().splitlines())) > 700]
    assert not long_lab, long_lab


def test_docs_architecture_and_the_readme_layout_follow_the_tree() -> None:
    """docs/architecture.md names every folder and module of the package and the contract's layers in order;
    README's layout has one line per folder."""
    import re
    import tomllib

    doc = (REPO / "docs" / "architecture.md").read_text()
    tree = doc[doc.index("## Tree"):]
    folder = None
    named: set[str] = set()
    for line in re.findall(r"^( +)(\S+)", tree, flags=re.M):
        indent, name = len(line[0]), line[1]
        if name.endswith("/") and indent == 2:
            folder = name.rstrip("/")
        elif name.endswith(".py"):
            named.add(name if indent == 2 else f"{folder}/{name}")
    modules = {str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py") if p.name != "__init__.py" or p.parent == PACKAGE}
    assert modules - named == set(), f"not in docs/architecture.md: {sorted(modules - named)}"
    assert named - modules == set(), f"gone from the package: {sorted(named - modules)}"
    contract = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"][0]["layers"]
    layers = [" | ".join(part.strip().removeprefix("pyllm_a100.") for part in layer.split("|")) for layer in contract]
    block = doc[doc.index("## Layering"):doc.index("## Tree")]
    written = [line.split("  ")[0].strip() for line in block.split("```")[1].strip().splitlines()]
    assert written == layers, (written, layers)
    readme = (REPO / "README.md").read_text()
    layout = readme[readme.index("## Layout"):]
    for sub in sorted(p.parent.name for p in PACKAGE.glob("*/__init__.py")):
        assert f"\npyllm_a100/{sub}/ " in layout, f"README's layout lacks pyllm_a100/{sub}/"
