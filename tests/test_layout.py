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


def _docstrings(path: Path) -> list[tuple[int, str]]:
    """(line, text) of the module's, its classes' and its functions' docstrings."""
    import ast

    tree = ast.parse(path.read_text())
    found = []
    for node in [tree, *ast.walk(tree)]:
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            text = ast.get_docstring(node, clean=False)
            if text:
                found.append((getattr(node, "lineno", 1), text))
    return found


def _defines(path: Path) -> set[str]:
    """The names a module defines or imports at its top level (a package: its __init__.py)."""
    import ast

    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


# module names that docstrings also use for something else: a variable (``options.kv_unified``), a man page
NOT_A_MODULE_THERE = {"options", "config", "systemd"}


def test_every_module_path_a_docstring_names_exists() -> None:
    """The map in the docstrings is true: a file (``serve/config.py``), a dotted path (``pyllm_a100.rpc.devices``) or a
    module's name (``capacity.plan``: a module of the same package, or of the package's root) named in a product
    docstring exists, and so does the name after it. Paths of llama.cpp's tree are checked against the pin."""
    import re

    llama = REPO / "vendor" / "llama.cpp"
    modules: dict[str, list[Path]] = {}  # a module's or package's last name -> its files
    for p in PACKAGE.rglob("*.py"):
        name = p.parent.name if p.name == "__init__.py" else p.stem
        modules.setdefault(name, []).append(p)
    dead = []
    for path in sorted(PACKAGE.rglob("*.py")):
        here = path.parent
        for line, text in _docstrings(path):
            where = f"{path.relative_to(REPO)}:{line}"
            for name in re.findall(r"(?<![\w/.-])((?:[\w.-]+/)*[\w-]+\.py)\b", text):
                bases = [here, PACKAGE, REPO, llama]
                if not any((b / name).exists() for b in bases) and (llama.is_dir() or "/" not in name or
                                                                    name.split("/")[0] in {p.name for p in PACKAGE.iterdir()}):
                    dead.append(f"{where}: {name}")
            for dotted in re.findall(r"\bpyllm_a100(?:\.\w+)+", text):
                parts = dotted.split(".")[1:]
                for cut in range(len(parts), 0, -1):
                    base = PACKAGE.joinpath(*parts[:cut])
                    target = base.with_suffix(".py") if base.with_suffix(".py").exists() else base / "__init__.py"
                    if target.exists():
                        rest = parts[cut:]
                        if rest and rest[0] not in _defines(target):
                            dead.append(f"{where}: {dotted} ({rest[0]} is not in {target.relative_to(REPO)})")
                        break
                else:
                    dead.append(f"{where}: {dotted}")
            for module, attr in re.findall(r"(?<![\w.`/-])([a-z_]+)\.([A-Za-z_]\w*)\b(?!\.\w)", text):
                if module in NOT_A_MODULE_THERE:
                    continue
                files = [p for p in modules.get(module, []) if p.parent in (here, PACKAGE, here.parent)
                         or p.parent.parent in (here.parent, PACKAGE)]
                if not files or attr in ("py", "json", "md", "toml", "cpp", "h", "cu", "cuh", "c", "gguf", "log"):
                    continue
                if not any(attr in _defines(p) or (p.name == "__init__.py" and (p.parent / f"{attr}.py").exists())
                           for p in files):
                    dead.append(f"{where}: {module}.{attr}")
    assert not dead, "docstrings name what does not exist:\n" + "\n".join(dead)


def test_each_package_docstring_lists_its_modules() -> None:
    """A package's docstring is its map: every module of the package is named in it, by its name."""
    import ast
    import re

    missing = []
    for init in sorted(PACKAGE.glob("*/__init__.py")):
        words = set(re.findall(r"\w+", ast.get_docstring(ast.parse(init.read_text())) or ""))
        missing += [f"{init.parent.name}/{p.name}" for p in sorted(init.parent.glob("*.py"))
                    if not p.name.startswith("__") and p.stem not in words]
    assert not missing, f"not named in their package's docstring: {missing}"
